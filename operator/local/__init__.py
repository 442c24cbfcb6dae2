"""``ovserve run``: an InferenceService's pods as local processes, built by the operator's own builders.

It lives with the builders it executes (``..pods``, ``..validation``,
``..config``), so the server package never imports the operator: ``ovserve``'s
CLI dispatches here by module name. :mod:`.plan` is pure (InferenceService ->
the processes to start), :mod:`.processes` starts, watches and stops them,
:mod:`.command` is the sub-command. Nothing here imports kopf or the Kubernetes
client, so the base install runs it. (The operator folder itself has no
``__init__.py``: ``import operator`` stays the standard library.)
"""
