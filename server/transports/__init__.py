"""Transports: parse the wire, call the data plane, encode the answer."""
