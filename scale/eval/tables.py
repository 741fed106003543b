"""The tables `scale eval` prints: one per evaluation, read from the result it writes (eval/<kind>.json)."""

from rich.console import Console
from rich.table import Table


def show(kind: str, result: dict) -> None:
    """Print the table of a `scale eval KIND` result."""
    Console().print(TABLES[kind](result))


def title(result: dict) -> str:
    weights = "random init" if result["random_init"] else result["weights"]
    return f"{result['eval']}: {result['model']} ({weights})"


def knn_table(result: dict) -> Table:
    table = Table("k", "top-1 (%)", "top-5 (%)", title=title(result))
    for k, acc in result["per_k"].items():
        table.add_row(k, f"{acc['top1']:.2f}", f"{acc['top5']:.2f}")
    return table


def linear_table(result: dict) -> Table:
    table = Table("lr (per 256)", "lr", "val top-1 (%)", "test top-1 (%)", "", title=title(result))
    for i, (base, lr) in enumerate(zip(result["base_lrs"], result["lrs"])):
        table.add_row(
            f"{base:g}",
            f"{lr:g}",
            f"{result['val_top1'][i]:.2f}",
            f"{result['test_top1_all'][i]:.2f}",
            "chosen" if i == result["best_index"] else "",
        )
    return table


def logreg_table(result: dict) -> Table:
    reference = result.get("reference", {}).get("per_dataset", {})
    table = Table("data set", "metric", "score", "lambda", "reference", title=title(result))
    for name, entry in result["datasets"].items():
        ref = reference.get(name, {}).get("reference")
        table.add_row(
            name,
            entry["metric"],
            f"{entry['score']:.2f}",
            f"{entry['best_lambda']:.3g}",
            "" if ref is None else f"{ref:.2f}",
        )
    footer = f"{result['average']:.2f}"
    if "reference" in result:
        footer += f" (wins {result['reference']['wins']}/{result['reference']['compared']})"
    table.add_row("average", "", footer, "", "")
    return table


def correspondence_table(result: dict) -> Table:
    table = Table("images", "top", "accuracy (%)", "distance error (px)", "similarity", title=title(result))
    table.add_row(
        str(result["images"]),
        str(result["top"]),
        f"{result['accuracy']:.2f}",
        f"{result['distance_error_px']:.2f}",
        f"{result['similarity']:.3f}",
    )
    return table


def finetune_table(result: dict) -> Table:
    table = Table("epoch", "step", "val top-1 (%)", "val top-5 (%)", title=title(result))
    for row in result["history"]:
        table.add_row(f"{row['epoch']:g}", str(row["step"]), f"{row['top1']:.2f}", f"{row['top5']:.2f}")
    return table


def video_segmentation_table(result: dict) -> Table:
    table = Table("videos", "objects", "J&F mean", "J mean", "F mean", title=title(result))
    table.add_row(
        str(len(result["videos"])),
        str(result["objects"]),
        f"{result['jf_mean']:.1f}",
        f"{result['j_mean']:.1f}",
        f"{result['f_mean']:.1f}",
    )
    return table


def retrieval_table(result: dict) -> Table:
    table = Table("data set", "images", "queries", "mAP Medium", "mAP Hard", title=title(result))
    table.add_row(
        result["dataset"],
        str(result["images"]),
        str(result["queries"]),
        f"{result['medium_map']:.1f}",
        f"{result['hard_map']:.1f}",
    )
    return table


def copy_detection_table(result: dict) -> Table:
    table = Table("queries", "originals", "distractors", "whitening images", "mAP strong", title=title(result))
    table.add_row(
        str(result["queries"]),
        str(result["originals"]),
        str(result["distractors"]),
        str(result["whitening_images"]),
        f"{result['strong_map']:.1f}",
    )
    return table


TABLES = {
    "knn": knn_table,
    "linear": linear_table,
    "logreg": logreg_table,
    "correspondence": correspondence_table,
    "finetune": finetune_table,
    "video-segmentation": video_segmentation_table,
    "retrieval": retrieval_table,
    "copy-detection": copy_detection_table,
}
