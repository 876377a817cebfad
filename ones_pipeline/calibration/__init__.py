"""Offline tooling, never imported at run time: fitting the remaining-work model (``progress_fit``) and checking
the simulator's ground truths against published measurements (``ones_artifact``, ``ones_catalogue_table``)."""
