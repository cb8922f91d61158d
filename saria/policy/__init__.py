"""Policies shared by the runtime cache and the replay: SSD admission and
post-prefill promotion."""

from saria.policy.admission import (
    AdmissionPolicy,
    DramOnly,
    FullDuplicate,
    HiCacheSelective,
    KvbmFrequencyFilter,
    Saria,
    WriteBack,
)
from saria.policy.factory import POLICIES, make_admission
from saria.policy.promotion import (
    PROMOTIONS,
    FullPromotion,
    LazyPartialPromotion,
    NoPromotion,
    PromotionPolicy,
    balanced_dram_share,
    make_promotion,
)

__all__ = [
    "POLICIES", "PROMOTIONS", "AdmissionPolicy", "DramOnly", "FullDuplicate", "FullPromotion",
    "HiCacheSelective", "KvbmFrequencyFilter", "LazyPartialPromotion", "NoPromotion",
    "PromotionPolicy", "Saria", "WriteBack", "balanced_dram_share", "make_admission",
    "make_promotion",
]
