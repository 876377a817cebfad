"""Calibration and validation of the simulator's ground truths against published measurements."""
