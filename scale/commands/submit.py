"""scale submit RECIPE [overrides] --nodes N --gpus-per-node G [Slurm options] [--sweep FILE] [--dry-run]"""

from pathlib import Path

from scale.commands.plan import TRACE_NOTE, add_gpu_arguments


def register(sub) -> None:
    parser = sub.add_parser(
        "submit",
        help="render an sbatch script into the run directory and submit it to Slurm",
        description="Render an sbatch script into the run directory and submit it to Slurm. A GPU job first prints "
        "`scale plan`'s verdict on the recipe as launched and refuses one that does not fit (--force). " + TRACE_NOTE,
    )
    parser.add_argument("recipe", help="recipe name (see `scale recipes list`) or YAML path")
    parser.add_argument("overrides", nargs="*", help="section.key=value")
    parser.add_argument("--nodes", type=int, default=1, help="nodes of the job")
    parser.add_argument("--gpus-per-node", type=int, default=0, help="one task per GPU; 0: a CPU job (gloo)")
    parser.add_argument("--tasks-per-node", type=int, help="tasks of a CPU job per node (default 1)")
    parser.add_argument("--partition", help="Slurm partition (checked against sinfo when available)")
    parser.add_argument("--time", help="time limit: minutes, HH:MM:SS or D-HH:MM:SS")
    parser.add_argument("--account", help="Slurm account to charge")
    parser.add_argument("--qos", help="Slurm quality of service")
    parser.add_argument("--constraint", help="Slurm node features, e.g. h100")
    parser.add_argument(
        "--cpus-per-task", type=int, help="CPUs per task (GPU jobs default to data.workers + 1, the loader's)"
    )
    parser.add_argument("--mem", help="memory per node, e.g. 256G")
    parser.add_argument(
        "--signal-lead",
        type=int,
        default=120,
        help="seconds before the time limit at which the run checkpoints and requeues (default 120)",
    )
    parser.add_argument("--job-name", help="default: the recipe name")
    parser.add_argument("--run-dir", help="run directory (default runs/<recipe>); a sweep puts task_NNN/ inside")
    parser.add_argument("--sweep", help="YAML list of override sets: one job array task and run directory each")
    parser.add_argument(
        "--template",
        type=Path,
        help="sbatch template (Jinja2; default: the one scale ships, slurm/train.sbatch.j2 in a checkout)",
    )
    parser.add_argument("--dry-run", action="store_true", help="render the script and print it; do not submit")
    parser.add_argument(
        "--force", action="store_true", help="submit even when `scale plan` predicts that the job does not fit"
    )
    add_gpu_arguments(parser)  # the GPU the verdict is judged for (`scale plan`'s options)
    parser.set_defaults(func=cmd_submit)


def cmd_submit(args) -> int:
    from scale.launch import slurm  # omegaconf, jinja2 and the recipe loader: only when the command runs

    options = slurm.SlurmOptions(
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        tasks_per_node=args.tasks_per_node,
        partition=args.partition,
        time=args.time,
        account=args.account,
        qos=args.qos,
        constraint=args.constraint,
        cpus_per_task=args.cpus_per_task,
        mem=args.mem,
        signal_lead=args.signal_lead,
        job_name=args.job_name,
    )
    job = slurm.plan(args.recipe, args.overrides, args.run_dir, options, sweep=args.sweep)
    if args.gpus_per_node:
        check_fit(job, args)
    script = slurm.write(job, args.template)
    if args.dry_run:
        print(script.read_text(), end="")
        print(f"# rendered {script} (not submitted)")
        print("\n".join(f"# {line}" for line in job.summary()))
        return 0
    job_id = slurm.submit(job)
    tasks = f" ({len(job.tasks)} array tasks)" if job.array else ""
    print(f"submitted job {job_id}{tasks}; run directory {job.run_dir}; script {script}")
    print("\n".join(job.summary()))
    return 0


def check_fit(job, args) -> None:
    """Print `scale plan`'s verdict on each task as it will run; refuse (UserError: exit 2) one that does not fit,
    unless --force."""
    from scale.commands.plan import judge
    from scale.config import load_recipe
    from scale.errors import UserError

    for task in job.tasks:
        cfg = load_recipe(job.recipe, task.overrides)
        verdict = judge(cfg, job.recipe, task.overrides, args.nodes, args.gpus_per_node, args)
        name = f"{task.run_dir.name}: " if job.array else ""
        print(f"# plan: {name}{verdict.verdict()}")
        if not verdict.fits and not args.force:
            raise UserError(
                f"{name}{verdict.setting.label()} does not fit ({verdict.own.memory['total'] / 2**30:.1f} GiB per "
                f"GPU): see `scale plan {args.recipe} --nodes {args.nodes} --gpus-per-node {args.gpus_per_node}`"
                f" for a setting that does, or pass --force"
            )
