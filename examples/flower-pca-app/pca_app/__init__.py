"""The example Flower app: federated private PCA with dpprecond (see README.md)."""
