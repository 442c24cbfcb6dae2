"""``ts.utils``: TorchServe's torch-free utilities that handlers import."""
