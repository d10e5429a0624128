"""Damaged and wrong data files end in one clear error, never a raw traceback.

Every file here is written by the test (tmp_path): truncated and corrupt IDX (plain and
gzip), PathMNIST ``.npz``, CIFAR-10 batches and ``.npy``/CSV matrices. Each failure mode has
its own test and checks that the error is ``ValueError`` (damaged content) or
``FileNotFoundError`` (absent), that it names the file, and the words that say what is wrong.
A seeded fuzz test at the end mutates valid files at random and accepts nothing but those
two exception types.
"""

from __future__ import annotations

import gzip
import io
import pickle
import struct
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dpprecond.data import load_fashion_mnist, load_matrix, read_idx
from dpprecond.data.base import Dataset
from dpprecond.data.cifar10 import load_cifar10, read_cifar_batch
from dpprecond.data.pathmnist import load_pathmnist
from tests.data.test_cifar10 import make_cifar_dir, py2_batch
from tests.data.test_loaders import make_fashion_dir, write_idx
from tests.data.test_pathmnist import make_npz


def _raises(exc: type[Exception], fn: Callable[[], object], path: Path, *words: str) -> str:
    """Call ``fn``, expect ``exc`` whose message names ``path`` and contains ``words``."""
    with pytest.raises(exc) as err:
        fn()
    msg = str(err.value)
    assert str(path) in msg, msg
    for word in words:
        assert word in msg, (word, msg)
    return msg


# --- IDX -----------------------------------------------------------------------------------

def _idx_bytes(arr: np.ndarray) -> bytes:
    header = bytes([0, 0, 0x08, arr.ndim]) + b"".join(struct.pack(">I", s) for s in arr.shape)
    return header + arr.astype(np.uint8).tobytes()


IDX = _idx_bytes(np.arange(60, dtype=np.uint8).reshape(3, 4, 5))


@pytest.mark.parametrize("keep", [len(gzip.compress(IDX)) - 1, len(gzip.compress(IDX)) - 9, 12])
def test_idx_gz_truncated(tmp_path: Path, keep: int) -> None:
    """Cut inside the deflate stream or the trailer: EOFError from gzip today."""
    p = tmp_path / "x-idx3-ubyte.gz"
    p.write_bytes(gzip.compress(IDX)[:keep])
    _raises(ValueError, lambda: read_idx(p), p, "truncated or corrupt gzip", "fetch the file")


def test_idx_gz_crc_mismatch(tmp_path: Path) -> None:
    """A flipped byte in the stored CRC: gzip.BadGzipFile."""
    raw = bytearray(gzip.compress(IDX))
    raw[-6] ^= 0xFF
    p = tmp_path / "x.gz"
    p.write_bytes(bytes(raw))
    _raises(ValueError, lambda: read_idx(p), p, "corrupt gzip", "CRC check failed")


def test_idx_gz_corrupt_deflate_data(tmp_path: Path) -> None:
    """An invalid block type in the deflate stream: zlib.error."""
    raw = bytearray(gzip.compress(IDX, mtime=0))
    raw[10] = 0xFF  # first deflate byte: BTYPE=11, reserved
    p = tmp_path / "x.gz"
    p.write_bytes(bytes(raw))
    _raises(ValueError, lambda: read_idx(p), p, "corrupt gzip", "error: Error -3")


def test_idx_plain_file_named_gz(tmp_path: Path) -> None:
    p = tmp_path / "x.gz"
    p.write_bytes(IDX)
    _raises(ValueError, lambda: read_idx(p), p, "not gzip-compressed", "remove the .gz suffix")


def test_idx_gzipped_file_without_gz_suffix(tmp_path: Path) -> None:
    p = tmp_path / "x"
    p.write_bytes(gzip.compress(IDX))
    _raises(ValueError, lambda: read_idx(p), p, "bad magic number", "give it a .gz suffix")


@pytest.mark.parametrize("gz", [False, True])
def test_idx_empty_file(tmp_path: Path, gz: bool) -> None:
    p = tmp_path / ("x.gz" if gz else "x")
    p.write_bytes(b"")
    _raises(ValueError, lambda: read_idx(p), p, "empty" if gz else "bad magic number")


@pytest.mark.parametrize("gz", [False, True])
def test_idx_truncated_header(tmp_path: Path, gz: bool) -> None:
    p = tmp_path / ("x.gz" if gz else "x")
    p.write_bytes(gzip.compress(IDX[:9]) if gz else IDX[:9])
    _raises(ValueError, lambda: read_idx(p), p, "truncated IDX header",
            "3 dimensions need 16 header bytes, the file has 9")


@pytest.mark.parametrize("gz", [False, True])
def test_idx_truncated_data(tmp_path: Path, gz: bool) -> None:
    """A complete gzip stream of a truncated IDX file (or a plain truncated file)."""
    p = tmp_path / ("x.gz" if gz else "x")
    p.write_bytes(gzip.compress(IDX[:-7]) if gz else IDX[:-7])
    _raises(ValueError, lambda: read_idx(p), p, "shape (3, 4, 5) (60 bytes", "holds 53 bytes",
            "truncated")


def test_idx_extra_bytes(tmp_path: Path) -> None:
    p = tmp_path / "x"
    p.write_bytes(IDX + b"\0\0")
    _raises(ValueError, lambda: read_idx(p), p, "holds 62 bytes (2 too many)", "corrupt")


def test_idx_huge_declared_shape_does_not_overflow(tmp_path: Path) -> None:
    """prod(shape) beyond int64 is computed exactly (np.prod wrapped to 0 here)."""
    p = tmp_path / "x"
    p.write_bytes(bytes([0, 0, 8, 3]) + struct.pack(">III", 2**31, 2**31, 2**31))
    _raises(ValueError, lambda: read_idx(p), p, f"({2**93} bytes of data)", "truncated")


def test_idx_not_a_file(tmp_path: Path) -> None:
    _raises(FileNotFoundError, lambda: read_idx(tmp_path), tmp_path, "IDX file not found")
    _raises(FileNotFoundError, lambda: read_idx(tmp_path / "nope.gz"), tmp_path / "nope.gz",
            "IDX file not found")


def test_fashion_mnist_truncated_gz_names_the_file(tmp_path: Path) -> None:
    make_fashion_dir(tmp_path, gz=True)
    p = tmp_path / "train-images-idx3-ubyte.gz"
    p.write_bytes(p.read_bytes()[:-100])
    _raises(ValueError, lambda: load_fashion_mnist(tmp_path), p, "truncated or corrupt gzip")


def test_fashion_mnist_labels_out_of_range(tmp_path: Path) -> None:
    """Labels 0..255 of a uint8 IDX file were accepted as classes of a 10-class problem."""
    make_fashion_dir(tmp_path, gz=False)
    p = tmp_path / "t10k-labels-idx1-ubyte"
    write_idx(p, np.array([0, 1, 2, 3, 10], dtype=np.uint8))
    _raises(ValueError, lambda: load_fashion_mnist(tmp_path), p, "must be integers in [0, 10)",
            "[0, 10]")


def test_fashion_mnist_images_of_wrong_dtype(tmp_path: Path) -> None:
    """Float IDX images would have been divided by 255 as if they were bytes."""
    make_fashion_dir(tmp_path, gz=False, n_test=5)
    p = tmp_path / "t10k-images-idx3-ubyte"
    data = np.zeros((5, 28, 28), ">f4")
    p.write_bytes(bytes([0, 0, 0x0D, 3]) + struct.pack(">III", 5, 28, 28) + data.tobytes())
    _raises(ValueError, lambda: load_fashion_mnist(tmp_path), p, "expected uint8 images",
            "got >f4 (5, 28, 28)")


def test_fashion_mnist_count_mismatch_names_both_files(tmp_path: Path) -> None:
    make_fashion_dir(tmp_path, gz=False, n_train=12)
    lab = tmp_path / "train-labels-idx1-ubyte"
    write_idx(lab, np.zeros(11, dtype=np.uint8))
    msg = _raises(ValueError, lambda: load_fashion_mnist(tmp_path), lab, "holds 12 images")
    assert str(tmp_path / "train-images-idx3-ubyte") in msg


def test_fashion_mnist_empty_split(tmp_path: Path) -> None:
    make_fashion_dir(tmp_path, gz=False)
    write_idx(tmp_path / "t10k-images-idx3-ubyte", np.zeros((0, 28, 28), np.uint8))
    write_idx(tmp_path / "t10k-labels-idx1-ubyte", np.zeros(0, np.uint8))
    _raises(ValueError, lambda: load_fashion_mnist(tmp_path),
            tmp_path / "t10k-images-idx3-ubyte", "n >= 1")


# --- PathMNIST .npz ------------------------------------------------------------------------

@pytest.fixture
def npz(tmp_path: Path) -> Path:
    make_npz(tmp_path / "pathmnist.npz")
    return tmp_path / "pathmnist.npz"


@pytest.mark.parametrize("fraction", [0.1, 0.5, 0.99])
def test_npz_truncated(npz: Path, fraction: float) -> None:
    """The zip directory sits at the end: any cut loses it (BadZipFile, file handle leaked)."""
    raw = npz.read_bytes()
    npz.write_bytes(raw[: int(len(raw) * fraction)])
    _raises(ValueError, lambda: load_pathmnist(npz), npz, "truncated or corrupt",
            "download pathmnist.npz again")


def test_npz_corrupt_member_data(npz: Path) -> None:
    """A damaged compressed member passes np.load and fails on first access (lazy reads)."""
    raw = bytearray(npz.read_bytes())
    with zipfile.ZipFile(npz) as z:
        info = z.getinfo("train_images.npy")
    start = info.header_offset + 30 + len(info.filename) + len(info.extra) + 20
    raw[start: start + 40] = bytes(40)
    npz.write_bytes(bytes(raw))
    _raises(ValueError, lambda: load_pathmnist(npz), npz, "cannot read train_images",
            "truncated or corrupt")


def test_npz_truncated_member(tmp_path: Path) -> None:
    """A complete zip holding a cut .npy member: numpy's ValueError, now naming file and key."""
    p = tmp_path / "pathmnist.npz"
    good = io.BytesIO()
    np.save(good, np.zeros((3, 28, 28, 3), np.uint8))
    with zipfile.ZipFile(p, "w") as z:
        z.writestr("train_images.npy", good.getvalue()[:-100])
        for key in ("train_labels", "test_images", "test_labels"):
            z.writestr(f"{key}.npy", good.getvalue())
    _raises(ValueError, lambda: load_pathmnist(p), p, "cannot read train_images", "EOF")


def test_npz_member_not_npy(tmp_path: Path) -> None:
    """np.load returns raw bytes for a non-.npy member (AttributeError on .dtype today)."""
    p = tmp_path / "pathmnist.npz"
    with zipfile.ZipFile(p, "w") as z:
        for key in ("train_images", "train_labels", "test_images", "test_labels"):
            z.writestr(f"{key}.npy", b"not an array")
    _raises(ValueError, lambda: load_pathmnist(p), p, "train_images is not a .npy array")


def test_npz_empty_file(npz: Path) -> None:
    npz.write_bytes(b"")
    _raises(ValueError, lambda: load_pathmnist(npz), npz, "is empty")


def test_npz_object_array_member(tmp_path: Path) -> None:
    p = tmp_path / "pathmnist.npz"
    make_npz(p, train_images=np.array([None, 1], dtype=object))
    _raises(ValueError, lambda: load_pathmnist(p), p, "train_images holds Python objects",
            "never loaded")


@pytest.mark.parametrize(("labels", "dtype"), [
    (np.array([["a"]] * 7), "<U1"),
    (np.zeros((7, 1)), "float64"),
    (np.ones((7, 1), bool), "bool"),
])
def test_npz_labels_of_wrong_dtype(tmp_path: Path, labels: np.ndarray, dtype: str) -> None:
    """Text labels raised numpy's UFuncTypeError (a TypeError) from min() today."""
    p = tmp_path / "pathmnist.npz"
    make_npz(p, train_labels=labels)
    _raises(ValueError, lambda: load_pathmnist(p), p, "train_labels must be integers in [0, 9)",
            f"got dtype {dtype}")


def test_npz_empty_split(tmp_path: Path) -> None:
    """Zero images: numpy's 'cannot reshape array of size 0' without the file name today."""
    p = tmp_path / "pathmnist.npz"
    make_npz(p, test_images=np.zeros((0, 28, 28, 3), np.uint8),
             test_labels=np.zeros((0, 1), np.uint8))
    _raises(ValueError, lambda: load_pathmnist(p), p, "test_images holds no pixels")


def test_npz_with_wrong_keys_and_shapes_still_refused(tmp_path: Path) -> None:
    """(Covered in test_pathmnist.py; here the message must also name the file.)"""
    p = tmp_path / "pathmnist.npz"
    make_npz(p, drop="train_images")
    _raises(ValueError, lambda: load_pathmnist(p), p, "lacks key(s) train_images")
    make_npz(p, train_images=np.zeros((7, 28, 28, 3), np.int16))
    _raises(ValueError, lambda: load_pathmnist(p), p, "train_images must be uint8", "int16")


# --- CIFAR-10 batches ----------------------------------------------------------------------

def _batch() -> bytes:
    data = np.random.default_rng(0).integers(0, 256, size=(3, 3072), dtype=np.uint8)
    return py2_batch(data, [0, 5, 9], b"training batch 1 of 5")


@pytest.mark.parametrize("keep", [0, 3, 100, len(_batch()) // 2, len(_batch()) - 1])
def test_cifar_truncated_pickle(tmp_path: Path, keep: int) -> None:
    p = tmp_path / "data_batch_1"
    p.write_bytes(_batch()[:keep])
    _raises(ValueError, lambda: read_cifar_batch(p), p, "not a CIFAR python-version batch",
            "truncated or corrupt")


def test_cifar_truncated_batch_in_directory(tmp_path: Path) -> None:
    make_cifar_dir(tmp_path)
    p = tmp_path / "data_batch_4"
    p.write_bytes(p.read_bytes()[:-50])
    _raises(ValueError, lambda: load_cifar10(tmp_path), p, "unpickling failed")


@pytest.mark.parametrize(("labels", "dtype"), [
    (["a", "b"], "<U1"),
    ([0, None], "object"),
    ([0, 2**70], "object"),
    ([0.0, 1.0], "float64"),
])
def test_cifar_labels_of_wrong_type(tmp_path: Path, labels: list, dtype: str) -> None:
    """Text or None labels raised a TypeError from numpy's min() today."""
    p = tmp_path / "data_batch_1"
    p.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": labels}))
    _raises(ValueError, lambda: read_cifar_batch(p), p, "labels must be integers in [0, 10)",
            f"got dtype {dtype}")


def test_cifar_wrong_keys_with_mixed_key_types(tmp_path: Path) -> None:
    """sorted() of int and bytes keys raised a TypeError while building the message."""
    p = tmp_path / "data_batch_1"
    p.write_bytes(pickle.dumps({1: 2, b"data": np.zeros((2, 3072), np.uint8)}))
    _raises(ValueError, lambda: read_cifar_batch(p), p, "lacks key(s) ['labels']")


def test_cifar_empty_batch(tmp_path: Path) -> None:
    p = tmp_path / "data_batch_1"
    p.write_bytes(pickle.dumps({b"data": np.zeros((0, 3072), np.uint8), b"labels": []}))
    _raises(ValueError, lambda: read_cifar_batch(p), p, "holds no images")


def test_cifar_batch_not_a_file(tmp_path: Path) -> None:
    _raises(FileNotFoundError, lambda: read_cifar_batch(tmp_path), tmp_path, "not found")


# --- .npy and CSV matrices -----------------------------------------------------------------

def _csv(tmp_path: Path, text: str, name: str = "m.csv") -> Path:
    p = tmp_path / name
    p.write_text(text, encoding="utf-8")
    return p


def test_csv_ragged_rows(tmp_path: Path) -> None:
    p = _csv(tmp_path, "a,b,c\n1,2,3\n4,5,6\n7,8\n")
    _raises(ValueError, lambda: load_matrix(p), p, "line 4 has 2 values but line 2 has 3")


def test_csv_non_numeric_cell(tmp_path: Path) -> None:
    p = _csv(tmp_path, "1,2\n3,x\n")
    _raises(ValueError, lambda: load_matrix(p), p, "line 2, column 2: 'x' is not a number")


def test_csv_empty_cell_and_trailing_delimiter(tmp_path: Path) -> None:
    p = _csv(tmp_path, "1,,3\n4,5,6\n")
    _raises(ValueError, lambda: load_matrix(p), p, "line 1, column 2 is empty")
    p = _csv(tmp_path, "1,2,\n4,5,\n")
    _raises(ValueError, lambda: load_matrix(p), p, "line 1, column 3 is empty", "trailing ','")


def test_csv_wrong_delimiter_is_hinted(tmp_path: Path) -> None:
    p = _csv(tmp_path, "1;2\n3;4\n")
    _raises(ValueError, lambda: load_matrix(p), p, "'3;4' is not a number",
            "is the file ';'-separated?")


@pytest.mark.parametrize("text", ["", "\n\n\n", "# only a comment\n"])
def test_csv_empty_file(tmp_path: Path, text: str) -> None:
    """np.loadtxt returned a (0, 1) matrix with a UserWarning today."""
    p = _csv(tmp_path, text)
    _raises(ValueError, lambda: load_matrix(p), p, "no lines with data")


def test_csv_line_of_spaces(tmp_path: Path) -> None:
    """np.loadtxt reads it as a row of one column ('the number of columns changed')."""
    p = _csv(tmp_path, "1,2\n   \n3,4\n")
    _raises(ValueError, lambda: load_matrix(p), p, "line 2 holds only spaces")


def test_csv_header_only(tmp_path: Path) -> None:
    p = _csv(tmp_path, "a,b,c\n")
    _raises(ValueError, lambda: load_matrix(p), p, "only a header line")


@pytest.mark.parametrize(("first", "cell"), [("1+2j,3", "1+2j"), ("True,1", "True"),
                                             ("0x10,1", "0x10"), ("1,x", "x")])
def test_csv_damaged_first_row_is_not_taken_for_a_header(tmp_path: Path, first: str,
                                                         cell: str) -> None:
    """A first line mixing numbers and text was silently dropped as a header."""
    p = _csv(tmp_path, f"{first}\n4,5\n")
    _raises(ValueError, lambda: load_matrix(p), p, f"{cell!r} is not a number",
            "if line 1 is a header, pass skip_header=True")
    np.testing.assert_array_equal(load_matrix(p, skip_header=True), [[4.0, 5.0]])


def test_csv_not_utf8(tmp_path: Path) -> None:
    p = tmp_path / "m.csv"
    p.write_bytes("h\xe9ight,w\n1,2\n".encode("latin-1"))
    _raises(ValueError, lambda: load_matrix(p), p, "not UTF-8 text", "0xe9")
    p.write_bytes(b"1,2\n3,\xff\n")
    _raises(ValueError, lambda: load_matrix(p), p, "not UTF-8 text")


def test_csv_nan_and_inf_are_left_for_the_caller(tmp_path: Path) -> None:
    p = _csv(tmp_path, "x,y\n1,nan\n2,inf\n")
    out = load_matrix(p)
    assert np.isnan(out[0, 1]) and np.isinf(out[1, 1])


def test_csv_comments_blank_lines_and_tsv(tmp_path: Path) -> None:
    p = _csv(tmp_path, "# exported\n1,2\n\n3,4  # note\n")
    np.testing.assert_array_equal(load_matrix(p), [[1, 2], [3, 4]])
    p = _csv(tmp_path, "1\t2\n3\tx\n", name="m.tsv")
    _raises(ValueError, lambda: load_matrix(p), p, "line 2, column 2: 'x'", "'\\t'")


def _npy(tmp_path: Path, arr: np.ndarray, **kwargs: object) -> Path:
    p = tmp_path / "m.npy"
    np.save(p, arr, **kwargs)
    return p


@pytest.mark.parametrize("cut", [8, 60, 130])
def test_npy_truncated(tmp_path: Path, cut: int) -> None:
    p = _npy(tmp_path, np.ones((20, 5)))
    p.write_bytes(p.read_bytes()[:-cut] if cut < 100 else p.read_bytes()[:50])
    _raises(ValueError, lambda: load_matrix(p), p, "not a readable .npy file", "truncated")


def test_npy_damaged_header(tmp_path: Path) -> None:
    """A cut inside the header dict: tokenize.TokenError from numpy's parser today."""
    p = _npy(tmp_path, np.ones((2, 2)))
    raw = bytearray(p.read_bytes())
    brace = raw.index(b"}")
    raw[brace] = ord(" ")
    p.write_bytes(bytes(raw))
    _raises(ValueError, lambda: load_matrix(p), p, "not a readable .npy file")


def test_npy_empty_file(tmp_path: Path) -> None:
    """np.load raised EOFError today."""
    p = tmp_path / "m.npy"
    p.write_bytes(b"")
    _raises(ValueError, lambda: load_matrix(p), p, "is empty")


def test_npy_not_npy(tmp_path: Path) -> None:
    """Not the .npy magic: numpy's message suggested loading it as a pickle (allow_pickle)."""
    p = tmp_path / "m.npy"
    p.write_bytes(b"1,2\n3,4\n")
    msg = _raises(ValueError, lambda: load_matrix(p), p, "not a .npy file", "numpy.save")
    assert "allow_pickle" not in msg
    np.savez(tmp_path / "z.npz", a=np.ones((2, 2)))
    (tmp_path / "z.npz").rename(p)
    _raises(ValueError, lambda: load_matrix(p), p, "zip archive (.npz?)")


def test_npy_object_array(tmp_path: Path) -> None:
    p = _npy(tmp_path, np.array([[1, None]], dtype=object), allow_pickle=True)
    _raises(ValueError, lambda: load_matrix(p), p, "object array", "never loaded")


@pytest.mark.parametrize(("arr", "words"), [
    (np.ones((2, 2), complex), "complex numbers"),
    (np.array([[1, 2]], dtype="timedelta64[s]"), "non-numeric data of dtype timedelta64[s]"),
    (np.array([[1, 2]], dtype="datetime64[s]"), "non-numeric data of dtype datetime64[s]"),
    (np.array([["1", "2"]]), "non-numeric data of dtype <U1"),
    (np.zeros((2, 2), dtype=[("a", "f8")]), "non-numeric data"),
])
def test_npy_non_real_dtypes(tmp_path: Path, arr: np.ndarray, words: str) -> None:
    """Complex and timedelta arrays were cast to float silently (imaginary part dropped)."""
    p = _npy(tmp_path, arr)
    _raises(ValueError, lambda: load_matrix(p), p, words)


@pytest.mark.parametrize("shape", [(0, 3), (3, 0)])
def test_npy_empty_matrix(tmp_path: Path, shape: tuple[int, int]) -> None:
    p = _npy(tmp_path, np.zeros(shape))
    _raises(ValueError, lambda: load_matrix(p), p, f"empty matrix of shape {shape}")


def test_npy_booleans_and_integers_are_numbers(tmp_path: Path) -> None:
    for arr in (np.array([[True, False]]), np.array([[3, -1]], np.int16)):
        out = load_matrix(_npy(tmp_path, arr))
        assert out.dtype == np.float64
        np.testing.assert_array_equal(out, arr.astype(np.float64))


def test_skip_header_type(tmp_path: Path) -> None:
    p = _csv(tmp_path, "1,2\n")
    with pytest.raises(TypeError, match="skip_header"):
        load_matrix(p, skip_header="yes")  # type: ignore[arg-type]


# --- Dataset -------------------------------------------------------------------------------

def test_dataset_refuses_labels_out_of_range_or_not_integers() -> None:
    X = np.zeros((3, 2))
    with pytest.raises(ValueError, match=r"'d': y_test must be integers in \[0, 3\), got values "
                                         r"in \[0, 3\]; encode the classes"):
        Dataset("d", X, np.array([0, 1, 2]), X, np.array([0, 1, 3]), n_classes=3)
    with pytest.raises(ValueError, match=r"y_train must be integers .* got dtype float64"):
        Dataset("d", X, np.array([0.0, 1.0, 2.0]), X, np.array([0, 1, 2]), n_classes=3)
    with pytest.raises(TypeError, match=r"n_classes must be an integer, got 3.0"):
        Dataset("d", X, np.array([0, 1, 2]), X, np.array([0, 1, 2]), n_classes=3.0)
    with pytest.raises(ValueError, match=r"n_classes must be >= 1, got 0"):
        Dataset("d", X[:0], np.array([], int), X[:0], np.array([], int), n_classes=0)


# --- fuzz ----------------------------------------------------------------------------------

def _mutations(good: bytes, rng: np.random.Generator, n: int) -> list[bytes]:
    """Truncations, byte flips, insertions and deletions of ``good``."""
    out = []
    for _ in range(n):
        b = bytearray(good)
        op = rng.integers(4)
        i = int(rng.integers(len(b)))
        if op == 0:
            del b[i:]
        elif op == 1:
            for j in rng.integers(len(b), size=rng.integers(1, 8)):
                b[j] = int(rng.integers(256))
        elif op == 2:
            b[i:i] = rng.integers(0, 256, size=rng.integers(1, 20)).astype(np.uint8).tobytes()
        else:
            del b[i: i + int(rng.integers(1, 50))]
        out.append(bytes(b))
    return out


def _fuzz_inputs() -> list[tuple[str, bytes, Callable[[Path], object]]]:
    imgs = np.random.default_rng(1).integers(0, 256, (4, 6, 6, 3), dtype=np.uint8)
    labs = np.random.default_rng(2).integers(0, 9, (4, 1), dtype=np.uint8)
    npz = io.BytesIO()
    np.savez_compressed(npz, train_images=imgs, train_labels=labs, test_images=imgs,
                        test_labels=labs)
    npy = io.BytesIO()
    np.save(npy, np.random.default_rng(3).normal(size=(6, 4)))
    data = np.random.default_rng(4).integers(0, 256, (3, 3072), dtype=np.uint8)
    csv = "a,b\n" + "\n".join(f"{i}.5,{-i}e3" for i in range(8)) + "\n"
    return [
        ("x-idx", IDX, read_idx),
        ("x-idx.gz", gzip.compress(IDX), read_idx),
        ("pathmnist.npz", npz.getvalue(), load_pathmnist),
        ("data_batch_1", py2_batch(data, [1, 2, 3], b"b"), read_cifar_batch),
        ("data_batch_2", pickle.dumps({"data": data, "labels": [1, 2, 3]}), read_cifar_batch),
        ("m.npy", npy.getvalue(), load_matrix),
        ("m.csv", csv.encode(), load_matrix),
    ]


@pytest.mark.filterwarnings("ignore:invalid escape sequence:DeprecationWarning")
@pytest.mark.parametrize(("name", "good", "reader"), _fuzz_inputs(),
                         ids=[name for name, _, _ in _fuzz_inputs()])
def test_fuzzed_files_end_in_value_errors_only(tmp_path: Path, name: str, good: bytes,
                                               reader: Callable[[Path], object]) -> None:
    """50 random mutations per format: a result or a ValueError naming the file, nothing else.

    Run with more seeds and 1500 mutations per format while developing, it found
    BadZipFile, zlib.error, NotImplementedError, RuntimeError, tokenize.TokenError,
    LookupError, MemoryError and SystemError escaping the readers.
    """
    p = tmp_path / name
    for raw in _mutations(good, np.random.default_rng(20260512), 50):
        p.write_bytes(raw)
        try:
            reader(p)
        except ValueError as exc:
            assert str(p) in str(exc), str(exc)


@pytest.mark.parametrize("arrays", [
    {"X": np.ones((10, 3)), "y": np.arange(9) % 3},
    {"X_train": np.ones((10, 3)), "y_train": np.arange(10) % 3,
     "X_test": np.ones((4, 3)), "y_test": np.arange(5) % 3},
])
def test_labelled_npz_with_fewer_labels_than_rows_names_both(tmp_path: Path,
                                                              arrays: dict) -> None:
    from dpprecond.data.labelled import load_labelled

    path = tmp_path / "bad.npz"
    np.savez(path, **arrays)
    with pytest.raises(ValueError, match=r"rows but y.* labels; give one label per row"):
        load_labelled(path)
