"""Average precision of rankings as the retrieval benchmarks compute it (Holidays / Copydays evaluation package and
revisited Oxford/Paris `compute_map`): trapezoids under the precision-recall curve, so a positive at 0-based rank r,
the j-th positive found (0-based), adds (j / r + (j + 1) / (r + 1)) / 2 per unit of recall (j / r is 1 at r = 0).

Revisited protocol (Radenovic et al. 2018): each query has `easy`, `hard` and `junk` database images. Medium counts
easy + hard as positives and ignores junk; Hard counts hard only and ignores junk + easy. Ignored images are taken
out of the ranking before the positives' ranks are read; a query with no positive is left out of the mean.
"""

import numpy as np


def average_precision(positive_ranks, positives: int) -> float:
    """AP from the sorted 0-based ranks of the positives found and the number of positives there are."""
    ranks = np.sort(np.asarray(positive_ranks, dtype=np.float64))
    found = np.arange(len(ranks), dtype=np.float64)
    before = np.divide(found, ranks, out=np.ones_like(ranks), where=ranks > 0)
    after = (found + 1) / (ranks + 1)
    return float(((before + after) / 2).sum() / positives)


def query_ap(ranking: np.ndarray, positives, ignored) -> float:
    """AP of one query's ranking (database indices, best first); NaN without positives."""
    positives = np.asarray(positives, dtype=np.int64).ravel()
    if positives.size == 0:
        return float("nan")
    kept = ranking[~np.isin(ranking, np.asarray(ignored, dtype=np.int64).ravel())]
    return average_precision(np.flatnonzero(np.isin(kept, positives)), positives.size)


PROTOCOLS = {  # name -> (positive kinds, ignored kinds)
    "easy": (("easy",), ("junk", "hard")),
    "medium": (("easy", "hard"), ("junk",)),
    "hard": (("hard",), ("junk", "easy")),
}


def revisited_map(ranks: np.ndarray, gnd: list[dict], protocol: str) -> float:
    """mAP (%) of `ranks` [database, queries] (each column a query's ranking) under a revisited protocol."""
    positive_kinds, ignored_kinds = PROTOCOLS[protocol]
    aps = []
    for query, truth in enumerate(gnd):
        positives = np.concatenate([np.asarray(truth[k], dtype=np.int64).ravel() for k in positive_kinds])
        ignored = np.concatenate([np.asarray(truth.get(k, []), dtype=np.int64).ravel() for k in ignored_kinds])
        aps.append(query_ap(ranks[:, query], positives, ignored))
    return 100.0 * float(np.nanmean(aps))
