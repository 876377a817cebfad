from pathlib import Path

import pytest

SHARED = Path(__file__).resolve().parents[2] / "shared" / "traces"


@pytest.fixture(scope="session")
def traces() -> Path:
    if not SHARED.is_dir():
        pytest.skip(f"shared traces not found at {SHARED}")
    return SHARED
