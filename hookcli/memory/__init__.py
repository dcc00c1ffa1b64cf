"""Memory: the live-bytes tracker (``tracker``) and the step it follows (``step``)."""
