"""Trace-driven simulator: replays job traces under any policy with measured ground truth."""
