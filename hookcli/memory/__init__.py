"""Memory: the live-bytes tracker (``tracker``), the step it follows (``step``), ``--fit``
(``fit``) and autocast emulated on meta (``autocast``)."""
