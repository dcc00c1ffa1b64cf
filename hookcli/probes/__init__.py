"""Probes of the small commands: the hooks of one kind plus the columns they fill (see
``hookcli.session.Probe``): ``buffers`` and ``trace``. One file per probe.

A capability with a package of its own keeps its probe there (``hookcli.grads.probe``,
``hookcli.stats.probe``, ``hookcli.features.probe``, ``hookcli.cost.probe``); forward-pre
and forward shapes are kept by the session itself.
"""
