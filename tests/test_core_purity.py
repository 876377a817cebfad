"""The scheduling core imports numpy and the standard library only."""

import ast
import subprocess
import sys
from pathlib import Path

import ones_pipeline.core as core

CORE_DIR = Path(core.__file__).parent
FORBIDDEN = ("dagster", "mlflow", "docker", "torch", "pandas", "scipy", "matplotlib")


def _top_level_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_core_sources_import_only_numpy_and_stdlib():
    allowed = set(sys.stdlib_module_names) | {"numpy", "ones_pipeline", "__future__"}
    for path in CORE_DIR.rglob("*.py"):
        bad = _top_level_imports(path) - allowed
        assert not bad, f"{path.relative_to(CORE_DIR)} imports {sorted(bad)}"


def test_running_every_policy_loads_no_forbidden_module():
    code = (
        "import sys\n"
        "from ones_pipeline.core.policies import make_policy, policy_names\n"
        "from ones_pipeline.core.types import *\n"
        "spec = JobSpec(name='a', model='m', dataset_size=100, per_gpu_batch=8, requested_gpus=2)\n"
        "view = JobView(spec=spec, status=JobStatus.PENDING, submit_time_s=0.0)\n"
        "for name in policy_names():\n"
        "    make_policy(name).decide(0.0, Cluster.uniform(2, 2), [view], Schedule())\n"
        f"bad = [m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r}]\n"
        "print(','.join(bad))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "", f"core pulled in: {out.stdout.strip()}"
