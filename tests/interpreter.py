"""Triton's interpreter (TRITON_INTERPRET=1, the CPU machines' way to run the kernels) re-patches triton.language
on every call of a `@triton.jit` helper inside a kernel: `inspect.getmembers` over the language's modules each
time, about a quarter of an interpreted tree-attention test. Inside a launch the modules a helper sees are mostly
patched already (the launch restores them when it ends): a helper call patches only those that are not."""
from __future__ import annotations

import inspect


def skip_repatching() -> None:
    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return
    patch = interpreter._patch_lang

    def patch_once(fn):
        langs = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)]
        if langs and all(not tl.core.is_builtin(lang.load) for lang in langs):  # the interpreter's already
            return interpreter._LangPatchScope()
        return patch(fn)
    interpreter._patch_lang = patch_once
