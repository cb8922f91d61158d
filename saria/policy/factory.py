"""Admission and promotion policies built by name, in one place: the CLI,
the replay, the engine's connector, ``saria serve`` and the LMCache adapter
all call ``make_admission`` / ``make_promotion`` here."""

from __future__ import annotations

from saria.errors import ConfigError
from saria.policy.admission import (
    AdmissionPolicy,
    DramOnly,
    FullDuplicate,
    HiCacheSelective,
    KvbmFrequencyFilter,
    Saria,
    WriteBack,
)
from saria.policy.budget import BudgetAdmission
from saria.policy.promotion import PROMOTIONS, make_promotion

__all__ = ["POLICIES", "PROMOTIONS", "make_admission", "make_promotion"]


#: Policy names that scripts rely on, with their constructors.
POLICIES = {
    "dram-only": DramOnly,
    "full-duplicate": FullDuplicate,
    "write-back": WriteBack,
    "saria": lambda: Saria(evictions=2, name="saria"),
    "E2": lambda: Saria(evictions=2),
    "E3": lambda: Saria(evictions=3),
    "E5": lambda: Saria(evictions=5),
    "R2": lambda: Saria(reuse=2),
    "R4": lambda: Saria(reuse=4),
    "E2+R2": lambda: Saria(evictions=2, reuse=2),
    "hicache-selective": HiCacheSelective,
    "kvbm-filter": KvbmFrequencyFilter,
}


def make_admission(name: str, *, dwpd: float = 1.0) -> AdmissionPolicy:
    """A fresh policy object by name: the names above, any ``E<k>``,
    ``R<j>``, ``E<k>+R<j>``, or ``budget`` / ``budget:<fraction>`` (of the
    drives' `dwpd` rating). Unknown names list the valid ones."""
    if name in POLICIES:
        return POLICIES[name]()
    if name == "budget" or name.startswith("budget:"):
        frac = name.partition(":")[2] or "1"
        try:
            fraction = float(frac)
        except ValueError:
            raise ConfigError("policy", f"budget fraction must be a number, got {frac!r} "
                              f"in {name!r}") from None
        return BudgetAdmission(fraction, dwpd=dwpd)
    e = r = None
    ok = bool(name)
    for part in name.split("+"):
        if len(part) > 1 and part[0] in "ER" and part[1:].isdigit() and int(part[1:]) > 0:
            if part[0] == "E" and e is None:
                e = int(part[1:])
            elif part[0] == "R" and r is None:
                r = int(part[1:])
            else:
                ok = False
        else:
            ok = False
    if ok:
        return Saria(evictions=e, reuse=r, name=name)
    raise ConfigError("policy", f"unknown admission policy {name!r}; valid: "
                      f"{', '.join(POLICIES)}, budget (or E<k>, R<j>, E<k>+R<j>, budget:<fraction>)")
