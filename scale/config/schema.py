"""The typed recipe: one dataclass per section, composed from the packages that own each concern."""

from dataclasses import dataclass, field
from typing import Any

from scale.config.fields import FIXED, NOTED, at_least, choice, listed_in, plain, within
from scale.data.config import DataConfig
from scale.engine.config import EngineConfig, OptimConfig
from scale.methods.config import MethodConfig
from scale.models.config import ModelConfig
from scale.trackers.config import TrackerConfig
from scale.watch.config import CollapseConfig, ProbeConfig


@dataclass
class MetaConfig:
    # the row's display name (reports, trackers); empty: the recipe's name, e.g. dino/table2/vit_s16
    name: str = ""
    paper: str = ""  # dino | mocov3 | esvit | drloc | scale
    # the paper's table or figure, e.g. table2 (`scale recipes list --table`)
    table: str = ""
    # the row of that table as the paper names it, e.g. ViT-S/16
    row: str = ""
    devices: int = at_least(8, 1)  # device count the paper's row assumes
    reported: dict[str, Any] = field(default_factory=dict)  # the paper's numbers for this row
    # free text; a line `missing: ...` makes `scale recipes check` fail, naming the part not built yet
    notes: str = ""


@dataclass
class TrainConfig:
    # length of the training in epochs (the lr, weight decay, momentum and temperature schedules span them)
    epochs: int = at_least(100, 1, resume=NOTED)  # extending a run stretches its schedules from here on
    # images per optimizer step, over all ranks
    global_batch: int = at_least(1024, 1, resume=FIXED)  # the loader's saved position counts its steps
    # None: the train manifest's sample count. Fixed: the saved position, epoch and schedules are counted in it
    samples_per_epoch: int | None = at_least(None, 1, resume=FIXED)
    max_steps: int | None = at_least(None, 1)  # stop early (smoke runs, benchmarks)
    seed: int = plain(0, FIXED)  # the data order and the RNG streams a resume restores
    # steps between log lines: the only steps (with checkpoints) on which the host reads the metrics
    log_every: int = at_least(10, 1)
    ckpt_every_steps: int = at_least(0, 0)  # 0: once per epoch
    # how many of the newest checkpoints are kept
    keep_last: int = at_least(2, 1)
    keep_every: int = at_least(0, 0)  # also keep every M-th step's checkpoint (0: none)
    # write checkpoints in the background while the training goes on
    async_save: bool = False
    # signals on which every rank checkpoints at the next step boundary and exits 3 (requeue)
    preempt_signals: list[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    # steps between the ranks' agreement on a received preemption signal (a host wait each time); see
    # docs/explanation/engines.md
    preempt_check_every: int = at_least(5, 1)
    knn_monitor_every: int = at_least(0, 0)  # steps; 0 disables the k-NN monitor
    grad_monitor_every: int = at_least(0, 0)  # steps; per-layer gradient norms and spikes (MoCo v3 Fig. 4); 0 disables
    # methods with a class head (supervised, DRLoc, fine-tuning rows): top-1/top-5 on data.val every this many
    # epochs and after the last step, into metrics.jsonl and eval/val.json; 0: no validation
    val_every_epochs: int = at_least(1, 0)
    # weights that initialise a fresh run (ignored when the run resumes): a `scale ckpt export`, a timm state dict,
    # or an official DINO, EsViT, MoCo v3, DRLoc or DINOv2 checkpoint, detected from the file (docs/how-to/weights.md); init_what: backbone (into the student's and teacher's backbones) | student |
    # teacher (that whole net, heads too, into both) | all (student into student, teacher into teacher)
    init_weights: str = ""
    # the part of train.init_weights to load: backbone | student | teacher | all (see init_weights)
    init_what: str = choice(
        "backbone", listed_in("scale.checkpoint.layouts", "WHAT", ("backbone", "student", "teacher", "all"))
    )
    # roll back: resume from the sealed checkpoint of this step (newer ones are moved to checkpoints/set_aside/,
    # never deleted); None: the newest loadable one. Applied once (checkpoints/steering.json)
    resume_step: int | None = at_least(None, 0)
    # parts of the saved state a resume leaves fresh, on purpose: optimizer | data | schedules | ema (docs/how-to/resume.md); applied once, like resume_step
    reset: list[str] = choice(
        [], listed_in("scale.checkpoint.resume", "RESETS", ("optimizer", "data", "schedules", "ema"))
    )
    # experiment trackers besides metrics.jsonl (always): tensorboard | wandb | mlflow (docs/how-to/trackers.md)
    # experiment trackers besides metrics.jsonl (always): tensorboard | wandb | mlflow (README 'Tracking runs')
    trackers: list[str] = field(default_factory=lambda: ["tensorboard"])
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    collapse: CollapseConfig = field(default_factory=CollapseConfig)  # the collapse alarm (docs/how-to/watch.md)
    stop_on_collapse: bool = False  # stop the run (exit 1, named reason) instead of one warning
    probe: ProbeConfig = field(default_factory=ProbeConfig)


@dataclass
class EvalConfig:
    batch_size: int = at_least(128, 1)  # images per rank in every evaluation pass (DINO: 128 per GPU)
    # k-NN (DINO eval_knn.py): weighted votes exp(sim / T) of the k nearest L2-normalised training features
    knn_k: list[int] = at_least([10, 20, 100, 200], 1)
    # T of the k-NN votes exp(sim / T)
    knn_temperature: float = at_least(0.07, 1e-8)
    # k-NN monitor during pre-training (MoCo v3 appendix; Wu et al. 2018 k-NN): queue = 10% of ImageNet-1k
    knn_monitor_queue: int = at_least(128000, 1)
    # k of the k-NN monitor
    knn_monitor_k: int = at_least(200, 1)
    # whose evaluation protocol the recipe carries: dino | mocov3 | esvit (linear and k-NN, pre-training rows), or
    # finetune (the row is itself a fine-tuning run, scored on data.val); recipes/README.md lists each
    protocol: str = choice("dino", ["dino", "mocov3", "esvit", "finetune"])
    # linear probe (DINO eval_linear.py, MoCo v3 main_lincls.py): frozen backbone, SGD momentum 0.9, wd 0, cosine
    # to 0 per epoch. Feature: last_blocks (DINO ViT: class tokens of the last n blocks; EsViT Swin: their average-
    # pooled outputs) | pooled (MoCo v3 ViT: class token after the last block and final norm; ResNet: the final
    # global-average-pooled feature, the classifier's input in every official script)
    linear_feature: str = choice("last_blocks", ["last_blocks", "pooled"])
    linear_n_last_blocks: int = at_least(4, 1)  # DINO: 4 for ViT-S, 1 for ViT-B (with avgpool)
    linear_avgpool: bool = False  # ViT: also the mean of the last block's patch tokens
    # the grid trained at once; each lr is for 256 images and scales linearly with the global batch (DINO)
    linear_lrs: list[float] = field(default_factory=lambda: [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1])
    # epochs of the linear probe
    linear_epochs: int = at_least(100, 1)
    # global batch of the probe (the lrs scale with it); 0: batch_size per rank (DINO: 128 per GPU on 8 GPUs)
    linear_batch: int = at_least(0, 0)
    linear_val_fraction: float = within(0.01, 0.0, 1.0)  # training samples held out (by key) to choose the lr
    # logistic-regression transfer suite (EsViT C.5): L-BFGS, lambda searched over 1e-6..1e6
    logreg_max_iter: int = at_least(1000, 1)
    logreg_val_fraction: float = within(
        0.2, 0.0, 1.0
    )  # carved from train when a data set ships no val split besides its test split
    # correspondence (EsViT C.7): flip, then colour jitter and greyscale of the center crop; top-10 matches
    correspondence_top: int = at_least(10, 1)
    # correspondence: brightness, contrast, saturation and hue of the view's colour jitter
    correspondence_jitter: list[float] = field(default_factory=lambda: [0.4, 0.4, 0.2, 0.1])
    # correspondence: probability that the view is made grey-scale
    correspondence_grayscale_p: float = within(0.2, 0.0, 1.0)
    correspondence_images: int | None = at_least(None, 1)  # None: every image of data.val (the paper: 50K ImageNet val)
    # video segmentation (DINO Table 5): the frames' std; eval_video_segmentation.py color_normalize uses 0.228 for
    # red where every other DINO script uses ImageNet's 0.229 (the mean is data.views.mean, the same in both)
    video_std: list[float] = field(default_factory=lambda: [0.228, 0.224, 0.225])


@dataclass
class Recipe:
    meta: MetaConfig = field(default_factory=MetaConfig)
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: MethodConfig = field(default_factory=MethodConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    # where each stated value comes from: {dotted key: [value, source]} (scale.recipes.provenance)
    sources: dict[str, Any] = field(default_factory=dict)
