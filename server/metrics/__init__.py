"""Prometheus metrics, through one place for every transport (docs/operations.md "Metrics").

- :mod:`.exposition`: the text format, written by ovserve (integer bucket bounds, no
  ``_total`` added to OVMS's counters; the operator writes its own metrics with it too);
- :mod:`.families`: OVMS's families exactly, and ovserve's own;
- :mod:`.calls`: what a request was (api, interface, method), for the transports;
- :mod:`.registry`: the process's :class:`~.registry.Metrics`, each model version's series, the hooks;
- :mod:`.config`: what the flags and config.json's ``monitoring`` block turn on.

Off by default: with metrics off the data plane holds no :class:`~.registry.Metrics`, every hook is one
``is None`` test, and nothing here is imported but :mod:`.calls` (the idle server's memory is a measured
target). This package imports nothing of the server but its errors, so every layer can reach it.
"""
