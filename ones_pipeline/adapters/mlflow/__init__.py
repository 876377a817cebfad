from ones_pipeline.adapters.mlflow.reader import JobProgress, read_progress
from ones_pipeline.adapters.mlflow.schema import (
    HISTORY_KEYS,
    PROGRESS_KEYS,
    TAG_CHANGED_PARAMS,
    TAG_GENERATION,
    TAG_JOB,
    TAG_RESTARTS,
    THROUGHPUT_KEYS,
)
from ones_pipeline.adapters.mlflow.sqlite_fast import VERIFIED_REVISIONS, fast_path_usable
from ones_pipeline.adapters.mlflow.store import (
    ALLOWED_SCHEMES,
    MAX_EXPERIMENT_NAME_LENGTH,
    TrackerError,
    check_reachable,
    default_tracking_uri,
    ensure_store,
    run_link,
)
from ones_pipeline.adapters.mlflow.writer import (
    END_STATUSES,
    MAX_KEY_LENGTH,
    MAX_METRICS_PER_BATCH,
    MAX_PARAM_VAL_LENGTH,
    MAX_PARAMS_TAGS_PER_BATCH,
    MAX_TAG_VAL_LENGTH,
    RUN_ID_FILE,
    JobRun,
)

__all__ = [
    "ALLOWED_SCHEMES",
    "END_STATUSES",
    "HISTORY_KEYS",
    "MAX_EXPERIMENT_NAME_LENGTH",
    "MAX_KEY_LENGTH",
    "MAX_METRICS_PER_BATCH",
    "MAX_PARAMS_TAGS_PER_BATCH",
    "MAX_PARAM_VAL_LENGTH",
    "MAX_TAG_VAL_LENGTH",
    "PROGRESS_KEYS",
    "RUN_ID_FILE",
    "TAG_CHANGED_PARAMS",
    "TAG_GENERATION",
    "TAG_JOB",
    "TAG_RESTARTS",
    "THROUGHPUT_KEYS",
    "VERIFIED_REVISIONS",
    "JobProgress",
    "JobRun",
    "TrackerError",
    "check_reachable",
    "default_tracking_uri",
    "ensure_store",
    "fast_path_usable",
    "read_progress",
    "run_link",
]
