"""The ``recpipe`` command: the top floor, above every package it dispatches to (``recpipe``,
``features``, ``trainer``, ``predict``, ``dev``); nothing below imports it."""
