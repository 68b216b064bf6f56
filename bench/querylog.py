"""A synthetic e-commerce search log with Zipf-like repeats (bench/bulk.py's input; deterministic per seed).

Distinct queries come from templates over word lists in English ("womens floral red midi dress size m") and
Chinese ("夏季女士碎花连衣裙"), shuffled with the seed; each row draws rank r with weight 1 / r^s (s = 1.05: a few
head queries repeat thousands of times, most tail queries once or twice). A few rows are empty, as in real logs.
"""
from __future__ import annotations

import csv
import itertools
import random
from pathlib import Path

EN_AUDIENCE = ["", "womens", "mens", "girls", "boys", "kids", "maternity", "baby", "unisex"]
EN_ATTR = ["", "slim fit", "oversized", "floral", "striped", "linen", "cotton", "waterproof", "high waist", "vintage",
           "cropped", "plus size", "summer", "winter", "wool"]
EN_COLOUR = ["", "black", "white", "red", "navy", "beige", "pink", "green", "grey"]
EN_PRODUCT = ["dress", "midi dress", "jeans", "shirt", "trench coat", "skirt", "t-shirt", "hoodie", "cardigan",
              "sweater", "shorts", "leggings", "jacket", "blouse", "polo", "sneakers"]
EN_DETAIL = ["", "size m", "size 140", "32x30", "for wedding", "for school", "on sale", "2024", "long sleeve"]
ZH_SEASON = ["", "夏季", "冬季", "春秋", "新款"]
ZH_AUDIENCE = ["", "女士", "男士", "女童", "男童", "孕妇", "儿童"]
ZH_ATTR = ["", "碎花", "修身", "宽松", "加绒", "纯棉", "高腰", "复古", "条纹", "显瘦"]
ZH_PRODUCT = ["连衣裙", "牛仔裤", "衬衫", "风衣", "半身裙", "T恤", "卫衣", "针织衫", "外套", "短裤", "打底裤"]
ZH_DETAIL = ["", " 140", " 大码", " 包邮", " 2024"]


def distinct_queries(seed: int = 0, pool: int = 120_000) -> list[str]:
    en = [" ".join(w for w in c if w) for c in itertools.product(EN_AUDIENCE, EN_ATTR, EN_COLOUR, EN_PRODUCT, EN_DETAIL)]
    zh = ["".join(c) for c in itertools.product(ZH_SEASON, ZH_AUDIENCE, ZH_ATTR, ZH_PRODUCT, ZH_DETAIL)]
    allq = sorted(set(en) | set(zh))
    random.Random(seed).shuffle(allq)
    return allq[:pool]


def zipf_log(rows: int, seed: int = 0, pool: int = 120_000, s: float = 1.05, empty_every: int = 2000) -> list[str]:
    ranks = distinct_queries(seed, pool)
    rng = random.Random(seed + 1)
    weights = list(itertools.accumulate(1 / (r + 1) ** s for r in range(len(ranks))))
    out = rng.choices(ranks, cum_weights=weights, k=rows)
    for i in range(0, rows, empty_every):
        out[i] = ""
    return out


def log_in(workdir: str | None, rows: int, prefix: str) -> tuple[Path, list[str], Path]:
    """A bench's work folder (a new temporary one unless given), the log's queries and its CSV there."""
    import tempfile
    work = Path(workdir or tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    queries = zipf_log(rows)
    return work, queries, write_csv(work / "log.csv", queries)


def write_csv(path: Path, queries: list[str]) -> Path:
    """id, query, ts: a log with two pass-through columns."""
    with path.open("w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "query", "ts"])
        w.writerows((i, q, 1_700_000_000 + i) for i, q in enumerate(queries))
    return path
