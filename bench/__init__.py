"""The ovserve benchmark: raw OpenVINO, ovserve and the KServe peer, back to back (see README.md)."""
