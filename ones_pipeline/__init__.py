"""ones-pipeline: an elastic deep-learning job scheduler (ONES, SC'21) and its trace-driven simulator."""

__version__ = "0.1.0"
