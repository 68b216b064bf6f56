"""Prefix KV cache (docs/design.md §5): every prompt's prefix split into fixed-size blocks keyed by a chain hash
(parent block's hash + the block's token ids), laid out in one pool of KV slots. Prompts that share
leading blocks (a common system header) share their slots, so that KV is stored and computed once.

This module only plans slots; the engine fills the pool's KV by running the decoder over the tokens of
blocks not seen before, attending to the slots planned for earlier blocks.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field


def chain_hash(parent: bytes, tokens: tuple[int, ...]) -> bytes:
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(",".join(map(str, tokens)).encode())
    return h.digest()


@dataclass
class Block:
    key: bytes
    tokens: tuple[int, ...]
    start: int  # first pool slot
    position: int  # position of the block's first token within its prefix


@dataclass
class PrefixPlan:
    block_size: int
    blocks: list[Block] = field(default_factory=list)
    prompt_blocks: list[list[int]] = field(default_factory=list)  # per prompt: indices into blocks
    new_blocks: list[list[int]] = field(default_factory=list)  # per prompt: blocks it computes itself
    n_slots: int = 0

    def prompt_slots(self, p: int) -> list[int]:
        """Pool slot of every prefix token of prompt p, in order."""
        return [self.blocks[b].start + i for b in self.prompt_blocks[p] for i in range(len(self.blocks[b].tokens))]

    def prompt_order(self) -> list[int]:
        """Prompts sorted by their block chains: prompts that share leading blocks become neighbours, so
        the prompts sharing any block form a contiguous range of this order."""
        return sorted(range(len(self.prompt_blocks)), key=lambda p: self.prompt_blocks[p])

    def _uses(self) -> dict[int, int]:
        uses: dict[int, int] = {}
        for bl in self.prompt_blocks:
            for b in bl:
                uses[b] = uses.get(b, 0) + 1
        return uses

    @property
    def shared_blocks(self) -> int:
        """Blocks used by more than one prompt."""
        return sum(1 for n in self._uses().values() if n > 1)

    def shared_tokens(self, p: int) -> int:
        """Prefix tokens of prompt p that lie in blocks another prompt uses too (stored and computed once)."""
        uses = self._uses()
        return sum(len(self.blocks[b].tokens) for b in self.prompt_blocks[p] if uses[b] > 1)

    def stats(self) -> dict[str, int]:
        total = sum(len(self.blocks[b].tokens) for bl in self.prompt_blocks for b in bl)
        return {"blocks": len(self.blocks), "shared_blocks": self.shared_blocks, "slots": self.n_slots,
                "prefix_tokens": total, "tokens_saved": total - self.n_slots}


def plan_prefixes(prefixes: list[tuple[int, ...]], block_size: int) -> PrefixPlan:
    """Assign pool slots to every prefix; identical chains of blocks get the same slots."""
    plan = PrefixPlan(block_size)
    index: dict[bytes, int] = {}
    for ids in prefixes:
        parent, mine, new = b"", [], []
        for pos in range(0, len(ids), block_size):
            toks = tuple(ids[pos:pos + block_size])
            key = chain_hash(parent, toks)
            if key not in index:
                index[key] = len(plan.blocks)
                plan.blocks.append(Block(key, toks, plan.n_slots, pos))
                plan.n_slots += len(toks)
                new.append(index[key])
            mine.append(index[key])
            parent = key
        plan.prompt_blocks.append(mine)
        plan.new_blocks.append(new)
    return plan
