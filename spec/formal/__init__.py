"""The formal side of the spec: the block ledger as a Z3 transition relation, and what is proved over it.

``symbolic`` is the encoding (``Encoding``, ``Bounds``) and ``symbolic_invariants`` the Z3 twins of the
safety invariants; ``bmc`` checks them up to a depth and proves them by k-induction, ``pdr`` by Spacer,
``parametric`` for every pool size, ``score_proofs`` the score policies' order properties, ``goals`` finds
the coverage cases; ``explore`` is the explicit-state search of the Python ledger itself. The model
(``kvspec.spec``) never imports this package.
"""
