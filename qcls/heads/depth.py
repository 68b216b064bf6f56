"""How deep the forward runs (docs/design.md §11): the layers an answer reads, and why.

A prompt whose answer comes from a head that reads the residual stream after layer L needs layers 1…L and
nothing after them: not the later layers, not the final norm, not the LM head's label rows. When every prompt
is answered so, the forward stops after the deepest layer any of them reads, only those layers are loaded, and
no label scores are computed (results carry no raw scores). The model's default head is the exception to the
loading (not to the forward): a choice the user did not make must not limit what a reload or a playground edit
may ask later, so every layer is loaded; naming the head file (calibration=…) loads only the layers it reads.
Anything that needs the LLM's own label scores or the final state (a prompt without a head, a head that reads
scores or the final norm's output, a calibration, the reference engine, engine.layer_exit=false) keeps the
whole depth, and the plan says which prompt forced it.
"""
from __future__ import annotations

from dataclasses import dataclass

from qcls.heads.head import FINAL, Head, Tap


BEYOND_WAY_OUT = ("start a new deployment (or Classifier) for it: the weights it needs were not loaded; to change "
                  "prompts and heads freely on a running server, start it with engine.layer_exit=false or with the "
                  "model's default head (every layer loaded), or fit a head for these prompts")


@dataclass(frozen=True)
class Depth:
    layers: int  # decoder layers the forward runs (and the backend loads)
    total: int  # the model's decoder layers
    reason: str  # one line: why this depth
    loaded: int = 0  # decoder layers loaded, when more than the forward runs (0: as many as it runs)

    @property
    def stops_early(self) -> bool:
        """The forward ends at a head's layer: no final norm, no label scores."""
        return self.layers < self.total

    @property
    def scores(self) -> bool:
        return not self.stops_early

    @property
    def loads(self) -> int:
        return max(self.loaded, self.layers)

    @property
    def loads_part(self) -> int | None:
        """The layers a backend loads (None: every one)."""
        return self.loads if self.loads < self.total else None

    def line(self) -> str:
        s = f"forward: {self.layers} of {self.total} decoder layers ({self.reason})"
        if not self.stops_early:
            return s
        if self.loads < self.total:
            return s + "; only those layers are loaded, no label scores"
        return s + (f"; no label scores; all {self.total} layers loaded, since the head is the model's default "
                    f"(name its file, calibration=PATH, to load only {self.layers})")

    def beyond(self, loaded: int) -> str | None:
        """Why this depth cannot run on weights of which only the first `loaded` decoder layers are loaded (a
        replica started with a named head file, asked for prompts that need more), or None; `BEYOND_WAY_OUT` says
        what to do instead."""
        if self.layers <= loaded:
            return None
        return (f"this configuration reads {self.layers} of the model's {self.total} decoder layers ({self.reason}), "
                f"but only the first {loaded} are loaded (those of the head file it was started with)")

    def as_dict(self) -> dict:
        return {"layers": self.layers, "of": self.total, "loaded": self.loads, "label_scores": self.scores,
                "why": self.reason}


def plan_depth(total: int, head: Head | None, prompts: list[str], *, enabled: bool = True, engine: str = "fast",
               taps: list[Tap] = (), default_head: bool = False) -> Depth:
    """The depth for these prompts (in config order) under `head` (None: raw scores everywhere); `taps`: hidden
    states kept besides the heads' (fitting), which the forward must reach too; `default_head`: the head is the
    model's default, not one the user named (every layer is loaded)."""
    def full(why: str) -> Depth:
        return Depth(total, total, why)

    if not enabled:
        return full("engine.layer_exit=false")
    if engine != "fast":
        return full(f"the {engine} engine runs every layer")
    deepest, by = 0, ""
    for name in prompts:
        ph = head.prompts.get(name) if head is not None else None
        if ph is None:
            return full(f"prompt '{name}' has no head: its answer is the LLM's label scores")
        if ph.score_weights is not None:
            return full(f"prompt '{name}''s head reads the label scores")
        if ph.read is None or ph.read.layer == FINAL:
            return full(f"prompt '{name}''s head reads the final state")
        if ph.read.layer > deepest:
            deepest, by = ph.read.layer, name
    extra = [t.layer for t in taps]
    if FINAL in extra:
        return full("the final state is kept for fitting")
    if extra and max(extra) > deepest:
        deepest, by = max(extra), ""
    if deepest >= total:  # a head for a deeper model: refused by the head checks with the numbers
        return full(f"a head reads layer {deepest} of {total}")
    return Depth(deepest, total, f"every prompt's answer comes from a head; the deepest reads layer {deepest}"
                 + (f" (prompt '{by}')" if by else " (hidden states kept for fitting)"),
                 loaded=total if default_head else 0)
