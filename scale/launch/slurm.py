"""Slurm: validate the options, render the sbatch script into the run directory, submit it, query a job's state.

One job trains one run directory (or, with a sweep, one job array trains one run directory per override set).
The rendered script starts one `scale train` per task with srun; a requeued job runs the same script again, and
`scale train` on an existing run directory resumes from its latest checkpoint. See slurm/README.md.

Multi-node jobs that shard the model (fsdp2, DeepSpeed ZeRO-3) shard it within a node by default: the tasks get
`engine.shard_size=<tasks per node>` (HSDP, or ZeRO++ hpZ), so that the per-layer all-gathers and reduce-scatters stay
on the node's fast links and only one gradient all-reduce per step crosses nodes. An `engine.shard_size` in the
overrides or a non-zero one in the recipe wins.
"""

import datetime
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import jinja2
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from scale.config import load_recipe
from scale.errors import PREEMPTED_EXIT_CODE, UserError
from scale.nofollow import write_atomic
from scale.readback import JOB, BadFile, read_json
from scale.resources import slurm_template

SCRIPT_NAME = "job.sbatch"
JOB_RECORD = "slurm.json"

# Slurm's --time formats: M, M:S, H:M:S, D-H, D-H:M, D-H:M:S
_TIME_FORMATS = [
    (re.compile(r"^(\d+)$"), ("m",)),
    (re.compile(r"^(\d+):(\d{1,2})$"), ("m", "s")),
    (re.compile(r"^(\d+):(\d{1,2}):(\d{1,2})$"), ("h", "m", "s")),
    (re.compile(r"^(\d+)-(\d{1,2})$"), ("d", "h")),
    (re.compile(r"^(\d+)-(\d{1,2}):(\d{1,2})$"), ("d", "h", "m")),
    (re.compile(r"^(\d+)-(\d{1,2}):(\d{1,2}):(\d{1,2})$"), ("d", "h", "m", "s")),
]
_SECONDS = {"d": 86400, "h": 3600, "m": 60, "s": 1}
_MEM_RE = re.compile(r"^\d+[KMGT]?$")


@dataclass
class SlurmOptions:
    nodes: int = 1
    gpus_per_node: int = 0  # 0: a CPU job (gloo)
    tasks_per_node: int | None = None  # None: one per GPU, or 1 for a CPU job
    partition: str | None = None
    time: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    cpus_per_task: int | None = None
    mem: str | None = None
    signal_lead: int = 120  # seconds before the time limit at which the job is told to checkpoint and requeue
    job_name: str | None = None

    @property
    def ntasks_per_node(self) -> int:
        if self.tasks_per_node is not None:
            return self.tasks_per_node
        return self.gpus_per_node or 1


@dataclass
class Task:
    """One training run: its directory and its overrides (the shared ones, then its sweep set)."""

    run_dir: Path
    overrides: list[str]
    shard_size: int = 0  # engine.shard_size the task runs with (0: all ranks)
    shard_source: str = "recipe"  # where it comes from: recipe | overrides | GPUs per node | tasks per node


@dataclass
class Job:
    recipe: str
    options: SlurmOptions
    run_dir: Path
    tasks: list[Task]
    array: bool = False
    python: str = field(default_factory=lambda: sys.executable)
    notes: list[str] = field(default_factory=list)  # what submit chose for the user, and what it warns about

    @property
    def script(self) -> Path:
        return self.run_dir / SCRIPT_NAME

    def summary(self) -> list[str]:
        """What `scale submit` prints about the job's layout: ranks and how the model is sharded over them."""
        ranks = self.options.nodes * self.options.ntasks_per_node
        lines = []
        for task in self.tasks:
            size = task.shard_size or ranks
            mesh = f"{ranks // size} replica(s) x {size} shard(s)"
            name = f"{task.run_dir.name}: " if self.array else ""
            lines.append(f"{name}{ranks} ranks, engine.shard_size={size} ({task.shard_source}): {mesh}")
        return lines + self.notes


def time_seconds(text: str) -> int | None:
    """Seconds of a Slurm --time value; None for 'infinite'. Raises UserError on any other format."""
    if text.lower() in ("infinite", "unlimited"):
        return None
    for pattern, units in _TIME_FORMATS:
        match = pattern.match(text)
        if match:
            return sum(int(v) * _SECONDS[u] for v, u in zip(match.groups(), units))
    raise UserError(f"--time '{text}': expected minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS")


def _check_text(flag: str, value: str | None) -> None:
    """Free-text options go into '#SBATCH' lines, which sbatch reads without a shell: no quotes or newlines."""
    if value is None:
        return
    if not value or any(c in value for c in "\"'\n\r\t\\") or not value.isprintable():
        raise UserError(f"{flag} '{value}': must be non-empty, without quotes, backslashes or control characters")


def partitions() -> list[str] | None:
    """The cluster's partitions, or None when sinfo is unavailable (e.g. rendering on a laptop)."""
    if shutil.which("sinfo") is None:
        return None
    try:
        out = subprocess.run(["sinfo", "-h", "-o", "%R"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sorted(set(out.stdout.split())) if out.returncode == 0 else None


def validate(options: SlurmOptions) -> None:
    """Every mistake Slurm would reject (or silently misread), before anything is written or submitted."""
    if options.nodes < 1:
        raise UserError(f"--nodes {options.nodes}: need at least 1 node")
    if options.gpus_per_node < 0:
        raise UserError(f"--gpus-per-node {options.gpus_per_node}: must be 0 (CPU job) or more")
    if options.tasks_per_node is not None:
        if options.tasks_per_node < 1:
            raise UserError(f"--tasks-per-node {options.tasks_per_node}: need at least 1 task per node")
        if options.gpus_per_node and options.tasks_per_node != options.gpus_per_node:
            raise UserError(
                f"--tasks-per-node {options.tasks_per_node} with --gpus-per-node "
                f"{options.gpus_per_node}: GPU jobs run one task per GPU"
            )
    if options.cpus_per_task is not None and options.cpus_per_task < 1:
        raise UserError(f"--cpus-per-task {options.cpus_per_task}: need at least 1")
    if options.mem is not None and not _MEM_RE.match(options.mem):
        raise UserError(f"--mem '{options.mem}': expected a number with an optional K, M, G or T suffix, e.g. 64G")
    if options.signal_lead < 1:
        raise UserError(f"--signal-lead {options.signal_lead}: must be at least 1 second")
    if options.time is not None:
        seconds = time_seconds(options.time)
        if seconds is not None and seconds <= options.signal_lead:
            raise UserError(
                f"--time '{options.time}' is not longer than the preemption signal lead "
                f"({options.signal_lead} s): give a longer --time or a shorter --signal-lead"
            )
    for flag in ("partition", "account", "qos", "constraint", "job_name"):
        _check_text("--" + flag.replace("_", "-"), getattr(options, flag))
    if options.partition is not None:
        known = partitions()
        if known is not None and options.partition not in known:
            raise UserError(
                f"--partition '{options.partition}': not a partition of this cluster (sinfo lists: {', '.join(known)})"
            )


def _override(key: str, value) -> str:
    """`key=value` whose value the recipe loader (YAML) reads back as `value`."""
    if isinstance(value, str) and _parses_back(key, value):
        return f"{key}={value}"
    return f"{key}={json.dumps(value)}"  # JSON is YAML: strings, lists and numbers keep their type


def _parses_back(key: str, text: str) -> bool:
    """Whether `key=text` reads back as the string itself ('1e-3', 'true' or '[1]' would not)."""
    try:
        return OmegaConf.select(OmegaConf.from_dotlist([f"{key}={text}"]), key) == text
    except (OmegaConfBaseException, yaml.YAMLError, ValueError):
        return False


def _flatten(mapping: dict, prefix: str = "") -> list[str]:
    items = []
    for key, value in mapping.items():
        if isinstance(value, dict):
            items += _flatten(value, f"{prefix}{key}.")
        else:
            items.append(_override(f"{prefix}{key}", value))
    return items


def load_sweep(path: str | Path) -> list[list[str]]:
    """A YAML list of override sets; each set is a mapping ({optim.lr: 0.001} or nested) or a list of
    `section.key=value` strings."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as err:
        raise UserError(f"--sweep {path}: cannot read: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise UserError(f"--sweep {path}: not valid YAML: {err}") from None
    if not isinstance(data, list) or not data:
        raise UserError(f"--sweep {path}: expected a non-empty YAML list of override sets")
    sets = []
    for index, item in enumerate(data):
        if isinstance(item, dict):
            sets.append(_flatten(item))
        elif isinstance(item, list) and all(isinstance(s, str) for s in item):
            sets.append(list(item))
        else:
            raise UserError(
                f"--sweep {path}: entry {index} must be a mapping of overrides or a list of "
                f"'section.key=value' strings, got {item!r}"
            )
    return sets


def _recipe_arg(recipe: str) -> str:
    """A recipe given as a file path is passed on absolute: the job may start in another directory."""
    path = Path(recipe)
    return str(path.resolve()) if path.is_file() else recipe


def _check_run_dir(run_dir: Path) -> None:
    # the run directory appears in '#SBATCH --output' lines (no shell there) and in Slurm's filename patterns
    if any(c in str(run_dir) for c in '"%\\\n\r') or not str(run_dir).isprintable():
        raise UserError(f"--run-dir '{run_dir}': must not contain quotes, '%', backslashes or control characters")


def shard_within_nodes(task: Task, cfg, options: SlurmOptions) -> Task:
    """A multi-node task of an engine that shards parameters shards them within a node unless told otherwise
    (scale.launch.layout.launch_setting: the one function `scale plan` judges the run with too)."""
    from scale.launch.layout import launch_setting, overrides_key

    task.shard_size = int(cfg.engine.shard_size)
    if overrides_key(task.overrides, "engine.shard_size"):
        task.shard_source = "overrides"
        return task
    size = launch_setting(cfg, task.overrides, options.nodes, options.ntasks_per_node).shard_size
    if size != task.shard_size:
        task.shard_size = size
        task.shard_source = "GPUs per node" if options.gpus_per_node else "tasks per node"
        task.overrides = [*task.overrides, f"engine.shard_size={task.shard_size}"]
    return task


def plan(
    recipe: str,
    overrides: list[str],
    run_dir: str | Path | None,
    options: SlurmOptions,
    sweep: str | Path | None = None,
) -> Job:
    """Validate everything (Slurm options, the recipe with each task's overrides) and lay out the tasks."""
    validate(options)
    sets = load_sweep(sweep) if sweep is not None else None
    cfg = load_recipe(recipe, overrides)
    root = Path(run_dir) if run_dir is not None else Path("runs") / cfg.meta.name
    root = root.expanduser().resolve()
    _check_run_dir(root)
    if sets is None:
        tasks = [shard_within_nodes(Task(root, list(overrides)), cfg, options)]
    else:
        tasks = []
        for index, extra in enumerate(sets):
            try:
                task_cfg = load_recipe(recipe, list(overrides) + extra)
            except UserError as err:
                raise UserError(f"--sweep {sweep}: entry {index}: {err}") from None
            task = Task(root / f"task_{index:03d}", list(overrides) + extra)
            tasks.append(shard_within_nodes(task, task_cfg, options))
    if options.job_name is None:
        options = replace(options, job_name=re.sub(r"[^\w.-]+", "_", cfg.meta.name))
    options, notes = resource_defaults(options, cfg)
    return Job(_recipe_arg(recipe), options, root, tasks, array=sets is not None, notes=notes)


def resource_defaults(options: SlurmOptions, cfg) -> tuple[SlurmOptions, list[str]]:
    """--cpus-per-task of a GPU job from the loader (data.workers + the training process itself: Slurm's default is
    often one CPU per task), and one-line warnings for what Slurm would otherwise decide alone (--time, --mem) and for data paths
    this machine cannot see."""
    notes = []
    if options.cpus_per_task is None and options.gpus_per_node:  # a CPU job's tasks share the node as Slurm says
        options = replace(options, cpus_per_task=int(cfg.data.workers) + 1)
        notes.append(
            f"--cpus-per-task={options.cpus_per_task}: data.workers {cfg.data.workers} + 1 (give it to change)"
        )
    if options.time is None:
        notes.append(
            "warning: no --time: the partition's default limit applies, and the checkpoint signal comes "
            f"{options.signal_lead} s before it"
        )
    if options.mem is None:
        notes.append(
            "warning: no --mem: the partition's default memory applies (often a few GB per CPU), which "
            "loader workers can exceed"
        )
    for key in ("train", "val"):
        path = cfg.data[key]
        if path and not Path(path).expanduser().exists():
            notes.append(
                f"warning: data.{key} {path} does not exist on this machine: the job fails unless the "
                "compute nodes see it"
            )
    return options, notes


def _directive(value) -> str:
    """A value for an '#SBATCH' line: sbatch splits these at whitespace unless the value is double-quoted."""
    text = str(value)
    return f'"{text}"' if any(c.isspace() for c in text) else text


def render(job: Job, template: Path | None = None) -> str:
    template = template or slurm_template()
    if not template.is_file():
        raise UserError(f"--template {template}: file not found")
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template.parent)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["sh"] = lambda v: shlex.quote(str(v))
    env.filters["directive"] = _directive
    try:
        return env.get_template(template.name).render(
            job=job,
            opts=job.options,
            tasks=job.tasks,
            preempted_exit_code=PREEMPTED_EXIT_CODE,
            rendered_at=datetime.datetime.now().isoformat(timespec="seconds"),
            template=str(template),
        )
    except jinja2.TemplateSyntaxError as err:
        raise UserError(f"--template {template}: line {err.lineno}: {err.message}") from None
    except jinja2.UndefinedError as err:
        raise UserError(f"--template {template}: {err.message}") from None


def write(job: Job, template: Path | None = None) -> Path:
    """Render the script into the run directory and create the directories Slurm writes stdout/stderr into."""
    text = render(job, template)
    for task in job.tasks:
        task.run_dir.mkdir(parents=True, exist_ok=True)
    job.script.write_text(text)
    job.script.chmod(0o755)
    return job.script


def submit(job: Job) -> str:
    """sbatch the rendered script; returns the job id and records it in the run directory (and each task's)."""
    if shutil.which("sbatch") is None:
        raise UserError("sbatch not found: run on a Slurm login node, or use --dry-run to only render the script")
    out = subprocess.run(["sbatch", "--parsable", str(job.script)], capture_output=True, text=True)
    if out.returncode != 0:
        raise UserError(f"sbatch rejected {job.script}: {out.stderr.strip() or out.stdout.strip()}")
    job_id = out.stdout.strip().split(";")[0]  # --parsable prints 'id' or 'id;cluster'
    submitted = datetime.datetime.now().isoformat(timespec="seconds")
    record = {
        "job_id": job_id,
        "script": str(job.script),
        "submitted": submitted,
        "array": job.array,
        "options": asdict(job.options),
        "tasks": [str(t.run_dir) for t in job.tasks],
    }
    _write_json(job.run_dir / JOB_RECORD, record)
    if job.array:
        for index, task in enumerate(job.tasks):
            _write_json(
                task.run_dir / JOB_RECORD,
                {"job_id": f"{job_id}_{index}", "script": str(job.script), "submitted": submitted},
            )
    return job_id


def _write_json(path: Path, data: dict) -> None:
    write_atomic(path, json.dumps(data, indent=2) + "\n")


def recorded_job(run_dir: str | Path) -> str | None:
    """The id of the last job submitted for this run directory, if any."""
    path = Path(run_dir) / JOB_RECORD
    try:
        return str(read_json(path, JOB)["job_id"])
    except (OSError, BadFile):
        return None


def _run(cmd: list[str]) -> str | None:
    if shutil.which(cmd[0]) is None:
        return None
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 and out.stdout.strip() else None


def job_state(job_id: str) -> dict | None:
    """State of a job from scontrol (pending, running and recently finished jobs, with the requeue count), else
    from sacct (older jobs, when accounting is enabled); None when Slurm knows nothing of it."""
    text = _run(["scontrol", "show", "job", "-o", job_id])
    if text:
        line = text.splitlines()[0]
        fields = {
            key: re.search(rf"\b{key}=(\S*)", line)
            for key in ("JobState", "Reason", "Restarts", "RunTime", "TimeLimit", "ExitCode", "NodeList")
        }
        info = {key.lower(): m.group(1) for key, m in fields.items() if m}
        return {"source": "scontrol", **info}
    text = _run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State,Elapsed,ExitCode,NodeList"])
    if text:
        state, elapsed, exit_code, nodes = (text.splitlines()[-1].split("|") + ["", "", "", ""])[:4]
        return {"source": "sacct", "jobstate": state, "runtime": elapsed, "exitcode": exit_code, "nodelist": nodes}
    return None
