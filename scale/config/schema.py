"""The typed recipe: one dataclass per section, composed from the packages that own each concern."""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from scale.data.config import DataConfig
from scale.engine.config import EngineConfig, OptimConfig
from scale.methods.config import MethodConfig
from scale.models.config import ModelConfig


@dataclass
class MetaConfig:
    name: str = ""
    paper: str = ""  # dino | mocov3 | esvit | drloc | scale
    table: str = ""
    row: str = ""
    devices: int = 8  # device count the paper's row assumes
    reported: Dict[str, Any] = field(default_factory=dict)  # the paper's numbers for this row
    notes: str = ""


@dataclass
class TrainConfig:
    epochs: int = 100
    global_batch: int = 1024
    samples_per_epoch: Optional[int] = None  # None: the train manifest's sample count
    max_steps: Optional[int] = None  # stop early (smoke runs, benchmarks)
    seed: int = 0
    log_every: int = 10
    ckpt_every_steps: int = 0  # 0: once per epoch
    keep_last: int = 2
    keep_every: int = 0  # also keep every M-th step's checkpoint (0: none)
    async_save: bool = False
    preempt_signals: List[str] = field(default_factory=lambda: ["SIGTERM", "SIGUSR1"])
    knn_monitor_every: int = 0  # steps; 0 disables the k-NN monitor


@dataclass
class EvalConfig:
    knn_k: List[int] = field(default_factory=lambda: [10, 20, 100, 200])
    knn_temperature: float = 0.07
    linear_n_last_blocks: int = 4
    linear_avgpool: bool = False
    linear_lrs: List[float] = field(default_factory=lambda: [1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1])
    linear_epochs: int = 100
    batch_size: int = 128


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
