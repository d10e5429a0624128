"""A real Flower deployment on loopback: one SuperLink, two SuperNodes, ``flwr run``.

Starts ``flower-superlink`` and two ``flower-supernode`` processes (insecure, 127.0.0.1,
free ports picked at start), submits ``examples/flower-app`` with ``flwr run`` (the
deployment engine), waits for the ServerApp's ``result.json``, and checks the final model
against the in-process simulator ``run_federated`` with the same seed (both SuperNodes
consent to the test seed with ``allow-seeded-noise=true``). Every process it started, and
their children, are stopped at the end, by process id.

Why this is a benchmark and not a test: it works (see docs/flower.md), but Flower 1.42's
deployment runtime starts a fresh ``flwr-clientapp`` Python process for every message a
SuperNode receives, and each of them imports Flower, dpprecond and scikit-learn and loads
the data again; with the nodes' polling this costs about 15 to 20 s per round on the
project's 2-core machine, so three rounds take over a minute, more than twice the whole
test suite. It also needs five long-lived daemons on fixed local ports and Flower's console
scripts on PATH. The Ray simulation tests cover the same ServerApp/ClientApp code paths.

Usage::

    PYTHONPATH=src python benchmarks/flower_deployment.py [--rounds 3] [--algorithm sofim]
        [--trust secure-aggregation] [--keep-logs DIR]

``--algorithm scaffold`` checks that each SuperNode keeps its control variate in its
Flower context across the per-message ``flwr-clientapp`` processes; ``fedfc``/``fednew``
run the setup round through the deployment. ``--app pca`` submits
``examples/flower-pca-app`` instead (``auto``, k = 5, epsilon 1 on digits' raw pixels) and
checks its components against the in-process ``fit_private_pca(..., clients=...)`` with
the same seed and trust (``--trust secure-aggregation``: every release one SecAgg+ sum,
bit for bit; local trust: within 1e-12, the clients add their noise before the sum).

    PYTHONPATH=src python benchmarks/flower_deployment.py --app pca --trust secure-aggregation
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
APP = ROOT / "examples" / "flower-app"
PCA_APP = ROOT / "examples" / "flower-pca-app"
SEED = 7


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def descendants(pid: int) -> list[int]:
    """Process ids of the children of ``pid``, recursively (from ``ps``)."""
    out = subprocess.run(["ps", "-eo", "pid=,ppid="], capture_output=True, text=True).stdout
    children: dict[int, list[int]] = {}
    for line in out.split("\n"):
        if line.strip():
            p, pp = (int(x) for x in line.split())
            children.setdefault(pp, []).append(p)
    found, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            found.append(c)
            todo.append(c)
    return found


def stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every started process and its descendants by id; SIGKILL what is left."""
    pids = []
    for p in procs:
        pids += [p.pid, *descendants(p.pid)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(p.poll() is None for p in procs):
            time.sleep(0.2)
        if sig == signal.SIGTERM:
            time.sleep(1.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--algorithm", default="sofim")
    parser.add_argument("--keep-logs", default=None, help="copy the daemons' logs here")
    parser.add_argument("--app", default="fl", choices=["fl", "pca"],
                        help="pca: the federated PCA app (examples/flower-pca-app)")
    parser.add_argument("--trust", default="local", choices=["local", "secure-aggregation"],
                        help="secure-aggregation: the rounds run through SecAgg+ (size "
                             "weights), checked against the simulator's secure run")
    args = parser.parse_args()

    work = Path(tempfile.mkdtemp(prefix="dpprecond-flower-"))
    link_port = free_port()
    node_ports = [free_port(), free_port()]
    env = dict(os.environ, FLWR_HOME=str(work / "home"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
               PYTHONPATH=os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")]),
               OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    (work / "home").mkdir()
    (work / "home" / "config.toml").write_text(
        f'[superlink]\ndefault = "loopback"\n\n[superlink.loopback]\n'
        f'address = "127.0.0.1:{link_port}"\ninsecure = true\n')
    bindir = Path(sys.executable).parent
    procs: list[subprocess.Popen] = []
    logs = []

    def start(name: str, cmd: list[str]) -> None:
        log = open(work / f"{name}.log", "w")  # closed in the finally block
        logs.append(log)
        procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      cwd=work))

    t0 = time.perf_counter()
    try:
        start("superlink", [str(bindir / "flower-superlink"), "--insecure", "--host",
                            "127.0.0.1", "--port", str(link_port),
                            "--disable-runtime-dependency-installation"])
        time.sleep(3)
        for i, port in enumerate(node_ports):
            start(f"supernode{i}", [
                str(bindir / "flower-supernode"), "--insecure",
                "--superlink", f"127.0.0.1:{link_port}", "--port", str(port),
                "--node-config", f"partition-id={i} num-partitions=2 allow-seeded-noise=true"])
        time.sleep(3)
        out = work / "out"
        if args.app == "pca":
            app, done = PCA_APP, out / "components.npy"
            run_config = (f"n-clients=2 noise-seed={SEED} round-timeout=300.0 "
                          f"output-dir='{out}' trust='{args.trust}'")
        else:
            app, done = APP, out / "params.npy"
            run_config = (f"algorithm='{args.algorithm}' n-clients=2 n-rounds={args.rounds} "
                          "noise-multiplier=1.3 "
                          f"target-epsilon='' clip-norm=1.0 noise-seed={SEED} "
                          f"partition-seed={SEED} round-timeout=300.0 output-dir='{out}'"
                          + ("" if args.trust == "local"
                             else " trust='secure-aggregation' weighting='size'"))
        t1 = time.perf_counter()
        run = subprocess.run([str(bindir / "flwr"), "run", str(app), "loopback", "--stream",
                              "--run-config", run_config], env=env, capture_output=True,
                             text=True, timeout=900)
        (work / "flwr-run.log").write_text(run.stdout + run.stderr)
        deadline = time.monotonic() + 60
        while not done.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        t2 = time.perf_counter()
        if not done.exists():
            print(f"FAILED: no result; flwr run exit {run.returncode}; logs in {work}")
            return 1
        result = json.loads((out / "result.json").read_text())
        got = np.load(done)
    finally:
        stop(procs)
        for log in logs:
            log.close()
        if args.keep_logs:
            shutil.copytree(work, args.keep_logs, dirs_exist_ok=True)
    if args.app == "pca":
        return _check_pca(got, result, args.trust, t1 - t0, t2 - t1, work)
    params, history = got, result["history"]

    from dpprecond.adapters.flower.data import featurized_dataset
    from dpprecond.fl import FLConfig, run_federated

    ds = featurized_dataset("digits")
    ref = run_federated(ds.X_train, ds.y_train, ds.X_test, ds.y_test, ds.n_classes,
                        algorithm=args.algorithm, n_clients=2, seed=SEED,
                        config=FLConfig(n_rounds=args.rounds, clip_norm=1.0,
                                        target_epsilon=None, noise_multiplier=1.3,
                                        trust=args.trust,  # type: ignore[arg-type]
                                        weighting=None if args.trust == "local"
                                        else "size"))
    diff = float(np.abs(params - ref.params).max())
    print(f"deployment: 1 SuperLink + 2 SuperNodes on loopback, {args.rounds} rounds of "
          f"{args.algorithm} on digits (noise scale 1.3, C=1, trust={args.trust})")
    print(f"start-up {t1 - t0:.1f} s, flwr run until result {t2 - t1:.1f} s")
    for r in history:
        print(f"  round {r['round']}: replied {r.get('clients_replied', '-')}, epsilon "
              f"{float(r['epsilon']):.4f}, test accuracy {r['test_accuracy']:.4f}")
    print(f"max |params - engine params| = {diff:.3g} (max |params| = "
          f"{np.abs(ref.params).max():.3g})")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if diff <= 1e-10 * max(1.0, float(np.abs(ref.params).max())) else 1


def _check_pca(components: np.ndarray, result: dict, trust: str, startup: float,
               seconds: float, work: Path) -> int:
    """The deployed PCA fit against the in-process fit on the same rows, seed and trust."""
    from dpprecond.adapters.flower.client_app import ClientInfo
    from dpprecond.adapters.flower.pca_app import load_pca_rows
    from dpprecond.pca import fit_private_pca

    rc = {"row-norm": 8.0}
    parts = [load_pca_rows(ClientInfo(i, 2, rc, {"partition-id": i, "num-partitions": 2}))
             for i in range(2)]
    bounds = np.cumsum([0] + [p.shape[0] for p in parts])
    ref = fit_private_pca(np.vstack(parts), 5, method="auto", target_epsilon=1.0,
                          target_delta=1e-6, row_norm=8.0, seed=SEED, clients=bounds,
                          trust=trust)
    diff = float(np.abs(components - ref.components).max())
    sums = result["info"].get("secure_aggregation", {})
    print(f"deployment: 1 SuperLink + 2 SuperNodes on loopback, federated PCA (auto, k=5, "
          f"epsilon {result['epsilon']:.6g} at delta {result['delta']:g}, trust={trust}, "
          f"{sums.get('n_sums', '-')} secure sums)")
    print(f"start-up {startup:.1f} s, flwr run until result {seconds:.1f} s")
    print(f"max |components - in-process fit's| = {diff:.3g}; epsilon in-process "
          f"{ref.epsilon:.6g}")
    shutil.rmtree(work, ignore_errors=True)
    ok = result["epsilon"] == ref.epsilon and (
        diff == 0.0 if trust == "secure-aggregation" else diff <= 1e-12)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
