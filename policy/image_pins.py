"""The supply-chain warning over a whole policy: every image referenced by tag only."""

from __future__ import annotations

from policy.images import pinned
from policy.pool import PoolPolicy


def image_warnings(policy: PoolPolicy) -> list[tuple[str, str]]:
    """``(field path, message)`` for every image that is not pinned by digest.

    A warning, not an error: tags are how most registries are used, but a tag can be
    re-pointed, so what runs is not what was reviewed (and ``:latest`` moves by design).
    """
    images = [("cluster.runtime_image", policy.cluster.runtime_image)]
    images += [(f"workloads.{i}.image", w.image) for i, w in enumerate(policy.workloads)]
    if policy.serving is not None:
        at, picker = "serving.endpoint_picker.images", policy.serving.endpoint_picker.images
        images += [(f"{at}.{field}", image) for field, image in picker.model_dump().items()]
    return [
        (
            path,
            f"{image} is referenced by tag only: the registry can move the tag to other "
            "content; pin it as IMAGE@sha256:<digest> (`docker buildx imagetools inspect "
            f"{image}` prints it)",
        )
        for path, image in images
        if not pinned(image)
    ]
