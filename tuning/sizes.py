"""The ``--sizes`` mini-language of ``smalltc tune``: tokens to specs (batch count 1).

=============  =====================================  =======================================
op             token                                  means
=============  =====================================  =======================================
gemm           ``8``  ``2-32``  ``2,4,8``              square m = n = k
               ``4x8x3``                              m x n x k
               ``8:nt+sb+beta``                       with transposes (nn, nt, tn, tt),
                                                      shared A/B (sa, sb), beta != 0 (beta)
action         ``DIM:P:NQ[:cNCOMP][:FORM]``           ``3:1-8:p+1,p+2``: 3D, p = 1..8,
mass_apply     ``DIM:P:NQ[:cNCOMP][:FORM]``           nq = p+1 and p+2; ``2:4:6``: nq = 6;
assembly       ``DIM:P:NQ[:FORM]``                    FORM: the operator instance, ``mass``
                                                      (the default), ``diffusion`` or
                                                      ``helmholtz``, with ``+co``
                                                      (collocated: nq = p+1) and, action and
                                                      mass_apply, ``+q32`` (float32 point
                                                      data, float64 vectors) or ``+vx``
                                                      (the vertex geometry); action and
                                                      mass_apply also ``force``/``force_t``
                                                      (the corner force: DIM components;
                                                      NQ ``2p`` as Laghos)
pairwise       ``action:DIM:P:NQ``                    every reshaped (8a)/(8b)/(9) kernel of
               ``assembly:DIM:P:NQ``                  the catalogue's steps for those sizes
basis          ``DIM:P:NQ[:cNCOMP][:WHAT]``           ``smalltc.interpolate``: WHAT
                                                      ``values`` (the default), ``gradients``
                                                      or ``both``, with ``+t`` (the
                                                      transpose, ``smalltc.integrate``) and
                                                      ``+m`` (through a map: a box mesh)
=============  =====================================  =======================================

Examples
--------
>>> [str(s) for s in parse("action", ["3:1-2:p+1"], "float64")]
['action_3d p=1 nq=2 E=1 float64', 'action_3d p=2 nq=3 E=1 float64']
>>> [s.size_key for s in parse("assembly", ["3:2:p+2:diffusion", "2:3:p+1:helmholtz+co"],
...                              "float64")]
['diffusion/assembly/3d/nd3nq4', 'helmholtz/assembly/2d/nd4nq4+co']
>>> [s.size_key for s in parse("action", ["3:2:p+1:diffusion+co", "3:2:p+2:c3:helmholtz"],
...                              "float64")]
['diffusion/action/3d/nd3nq3c1+co', 'helmholtz/action/3d/nd3nq4c3']
>>> [s.size_key for s in parse("mass_apply", ["3:4:p+2:diffusion+q32"], "float64")]
['diffusion/mass_apply/3d/nd5nq6c1+q32']
>>> [s.size_key for s in parse("mass_apply", ["3:2:p+2:diffusion+vx"], "float64")]
['diffusion/mass_apply/3d/nd3nq4c1+vx']
>>> [s.size_key for s in parse("basis", ["3:4:p+2:both+t+m", "2:1:3:c2"], "float64")]
['basis/3d/nd5nq6c1+both+t+m', 'basis/2d/nd2nq3c2+values']
>>> [(s.m, s.n, s.k) for s in parse("gemm", ["2,3", "4x8x3"], "float32")]
[(2, 2, 2), (3, 3, 3), (4, 8, 3)]
"""
from __future__ import annotations

from smalltc.backends.cuda import family_of
from smalltc.backends.cuda.contract9 import fold_k9
from smalltc.catalogue import steps
from smalltc.spec import (BASIS_WHATS, ActionSpec, AssemblySpec, BasisSpec, ContractSpec,
                          GemmSpec, MassApplySpec)

__all__ = ["parse", "DEFAULT_SIZES", "OPS"]

OPS = ("gemm", "action", "assembly", "mass_apply", "pairwise", "basis")
DEFAULT_SIZES = {
    "gemm": ["2-32", "2-32:nn+beta"],     # beta != 0: the docs/math.md section 6 benchmark setting
    "action": ["2:1-8:p+1,p+2", "3:1-8:p+1,p+2"],
    "assembly": ["2:1-6:p+1,p+2", "3:1-6:p+1,p+2"],
    "mass_apply": ["3:1-8:p+2", "3:1-8:p+2:diffusion", "3:1-8:p+1:diffusion+co"],
    "pairwise": ["action:2:1-8:p+2", "action:3:1-8:p+2", "assembly:2:1-6:p+2",
                 "assembly:3:1-6:p+2"],
    "basis": ["3:1-8:p+2:values+m", "3:1-8:p+2:values+t+m", "3:1-8:p+2:both+m",
              "3:1-8:p+2:both+t+m"],
}


#: the operator instances of the FORM field, and the flags each op takes after them
_QFUNCS = ("mass", "diffusion", "helmholtz", "force", "force_t")
_FLAGS = {"assembly": ("co",), "action": ("co", "q32", "vx"),
          "mass_apply": ("co", "q32", "vx")}
#: the corner force's instances: the kinematic field has DIM components; no
#: assembly, no flags
_FORCE = ("force", "force_t")


def _form(op, token, text):
    """The spec fields of a FORM field (``diffusion+co``, ``helmholtz``, ``mass+q32``)."""
    qfunc, *flags = text.split("+")
    bad = set(flags) - set(_FLAGS[op])
    if qfunc not in _QFUNCS or bad or len(set(flags)) != len(flags):
        raise ValueError(f"{op} size {token!r}: FORM {text!r} must be one of "
                         f"{', '.join(_QFUNCS)}, followed by "
                         f"{' and '.join('+' + f for f in _FLAGS[op])} where wanted")
    if qfunc in _FORCE and (op == "assembly" or flags):
        raise ValueError(f"{op} size {token!r}: FORM {text!r}: the corner force has no "
                         f"assembly and no flags")
    form = dict(qfunc=qfunc)
    if "co" in flags:
        form["collocated"] = True
    if "q32" in flags:
        form["qdtype"] = "float32"
    if "vx" in flags:
        form["geometry"] = "vertices"
    return form


def _ints(text, what):
    out = []
    for part in text.split(","):
        try:
            if "-" in part:
                a, b = part.split("-")
                out.extend(range(int(a), int(b) + 1))
            else:
                out.append(int(part))
        except ValueError:
            raise ValueError(f"{what}: {part!r} is not an integer, a list a,b or a range a-b") \
                from None
    if not out or min(out) < 1:
        raise ValueError(f"{what}: {text!r} must name positive integers")
    return out


def _gemm(token, dtype):
    sizes, _, flags = token.partition(":")
    fl = set(flags.split("+")) - {""}
    trans = next((f for f in fl if f in ("nn", "nt", "tn", "tt")), "nn")
    bad = fl - {"nn", "nt", "tn", "tt", "sa", "sb", "beta"}
    if bad:
        raise ValueError(f"gemm size {token!r}: unknown flag(s) {sorted(bad)}")
    kw = dict(dtype=dtype, trans_a=trans[0] == "t", trans_b=trans[1] == "t",
              shared_a="sa" in fl, shared_b="sb" in fl, beta_zero="beta" not in fl)
    if "x" in sizes:
        try:
            m, n, k = (int(v) for v in sizes.split("x"))
        except ValueError:
            raise ValueError(f"gemm size {token!r}: expected MxNxK") from None
        return [GemmSpec(batch=1, m=m, n=n, k=k, **kw)]
    return [GemmSpec(batch=1, m=n, n=n, k=n, **kw) for n in _ints(sizes, f"gemm size {token!r}")]


def _basis_form(token, text):
    """The BasisSpec fields of a WHAT field (``both+t+m``)."""
    what, *flags = text.split("+")
    if what not in BASIS_WHATS or set(flags) - {"t", "m"} or len(set(flags)) != len(flags):
        raise ValueError(f"basis size {token!r}: WHAT {text!r} must be one of "
                         f"{', '.join(BASIS_WHATS)}, followed by +t (the transpose) and +m "
                         "(through a map) where wanted")
    return dict(what=what, transpose="t" in flags), "m" in flags


def _fem(op, token, dtype):
    parts = token.split(":")
    opt = "[:FORM]" if op == "assembly" else "[:cNCOMP][:FORM]"
    if not 3 <= len(parts) <= (4 if op == "assembly" else 5):
        raise ValueError(f"{op} size {token!r}: expected DIM:P:NQ{opt}")
    form, ncomp = dict(qfunc="mass"), 1
    extra = parts[3:]
    if op != "assembly" and extra and extra[0][:1] == "c" and extra[0][1:].isdigit():
        ncomp = _ints(extra.pop(0)[1:], f"{op} size {token!r} (ncomp)")[0]
    if any(f[:1] == "c" and f[1:].isdigit() for f in extra):
        raise ValueError(f"{op} size {token!r}: expected DIM:P:NQ{opt} (cNCOMP before FORM)")
    if len(extra) > 1:
        raise ValueError(f"{op} size {token!r}: expected DIM:P:NQ{opt}")
    mapped = False
    if op == "basis":
        form, mapped = _basis_form(token, extra[0] if extra else "values")
    elif extra:
        form = _form(op, token, extra[0])
    dims = _ints(parts[0], f"{op} size {token!r} (dim)")
    if set(dims) - {1, 2, 3}:
        raise ValueError(f"{op} size {token!r}: dim must be 1, 2 or 3")
    ps = _ints(parts[1], f"{op} size {token!r} (p)")
    out = []
    for dim in dims:
        for p in ps:
            for q in parts[2].split(","):
                nq = (p + int(q[2:] or 0) if q.startswith("p+") else 2 * p if q == "2p"
                      else int(q) if q.isdigit() else None)
                if nq is None or nq < 1:
                    raise ValueError(f"{op} size {token!r}: nq {q!r} must be N, p+K or 2p")
                kw = dict(dim=dim, nq=nq, nd=p + 1, batch=1, dtype=dtype, **form)
                if op != "assembly":
                    nc = dim if form.get("qfunc") in _FORCE else ncomp
                    kw.update(ncomp=nc, comp_axis=nc > 1)
                if op == "mass_apply" or mapped:       # one element: its own DoFs
                    kw["ndofs"] = (p + 1) ** dim
                try:
                    out.append((ActionSpec if op == "action" else MassApplySpec
                                if op == "mass_apply" else BasisSpec if op == "basis"
                                else AssemblySpec)(**kw))
                except ValueError as err:       # collocated with nq != p + 1, ...
                    raise ValueError(f"{op} size {token!r}: {err}") from None
    return out


def _pairwise(token, dtype):
    op, _, rest = token.partition(":")
    if op not in ("action", "assembly"):
        raise ValueError(f"pairwise size {token!r}: starts with action: or assembly:")
    out = []
    for s in _fem(op, rest, dtype):
        for st in steps(op, s.dim):
            cs = fold_k9(ContractSpec(kind=st.kernel, batch=1, dtype=dtype,
                                      shared_x=st.x[0] == "B", shared_y=st.y[0] == "B",
                                      **st.extents(s.nd, s.nq))).with_batch(1)
            if family_of(cs) is not None:
                out.append(cs)
    return out


def parse(op, tokens, dtype):
    """Specs (batch 1, duplicates removed, in order) of ``tokens`` for ``op``."""
    if op not in OPS:
        raise ValueError(f"op must be one of {OPS}, got {op!r}")
    found, seen = [], set()
    for tok in tokens or DEFAULT_SIZES[op]:
        for tk in tok.split():
            specs = (_gemm(tk, dtype) if op == "gemm" else _pairwise(tk, dtype)
                     if op == "pairwise" else _fem(op, tk, dtype))
            for s in specs:
                if s.size_key not in seen:
                    seen.add(s.size_key)
                    found.append(s)
    return found
