"""The example Flower app: DP federated learning with dpprecond (see README.md)."""
