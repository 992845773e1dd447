"""Monitoring of a running monarch program: the client of its admin HTTP server
(``client``), the ``monarch top`` terminal UI (``tui``, drawn by the pure ``tui_render``)
and the post-mortem HTML report (``report``)."""
