"""Short labels for process ids, member ids and Faust workers' URLs: the tables show each by
its shortest unique prefix."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping


def _short_member(member_id: str) -> str:
    """A member id fits a narrow column by its tail (aiokafka ids end in a UUID)."""
    return member_id if len(member_id) <= 12 else "…" + member_id[-8:]


def _url_labels(urls: Iterable[str]) -> dict[str, str]:
    """Faust workers' URLs as the tables show them: each host by its shortest unique prefix
    among them, cut at the end of a DNS name label (``orders-0…`` for
    ``orders-0.orders.default.svc.cluster.local``: Kubernetes hosts share long tails), then
    its port (and path); a URL whose label another shares (the same host and port under
    another scheme) whole, scheme and all."""
    parts = {url: _host_and_rest(url) for url in set(urls)}
    prefixes = _unique_prefixes((host for host, _ in parts.values()), 1)
    labels = {}
    for url, (host, rest) in parts.items():
        # A prefix of whole labels, as a host is read: never "orders-1" for "orders-10"; an
        # IPv4 address whole (its first byte names nothing).
        ipv4 = host.replace(".", "").isdigit()
        cut = -1 if ipv4 else host.find(".", len(prefixes[host]) - 1)
        labels[url] = (host if cut < 0 else host[:cut] + "…") + rest
    shared = Counter(labels.values())
    return {url: url.rstrip("/") if shared[label] > 1 else label for url, label in labels.items()}


def _host_and_rest(url: str) -> tuple[str, str]:
    """A URL's host, and what follows it (``:port``, a path), scheme and trailing ``/`` off."""
    netloc, slash, path = url.split("://", 1)[1].rstrip("/").partition("/")
    host, colon, port = netloc.rpartition(":")
    if not colon or not port.isdigit() or host.endswith(":"):  # no port (or a bare IPv6)
        host, colon, port = netloc, "", ""
    return host, colon + port + slash + path


def _is_uuid(text: str) -> bool:
    return len(text) == 36 and text.count("-") == 4


def _unique_prefixes(ids: Iterable[str], least: int) -> dict[str, str]:
    """Each id by its shortest prefix of at least ``least`` characters that no other of
    ``ids`` starts with, as git names a commit (in sorted order only neighbours can share
    a longer prefix)."""
    ordered = sorted(set(ids))
    labels = {}
    for i, name in enumerate(ordered):
        length = least
        for other in ordered[max(i - 1, 0) : i] + ordered[i + 1 : i + 2]:
            pairs = enumerate(zip(name, other, strict=False))
            shared = next((k for k, (x, y) in pairs if x != y), min(len(name), len(other)))
            length = max(length, shared + 1)
        labels[name] = name[:length]
    return labels


def _member_labels(member_ids: Iterable[str]) -> dict[str, str]:
    """Member ids as the tables show them: each by its shortest unique tail of at least 8
    characters (a member id is its client id, which all members may share, and a UUID)."""
    ids = set(member_ids)
    tails = _unique_prefixes((m[::-1] for m in ids), 8)
    return {m: m if len(m) <= 12 else "…" + tails[m[::-1]][::-1] for m in ids}


def _process_labels(pids: Iterable[str]) -> dict[str, str]:
    """Process ids as the tables show them, none folded at 80 columns, none ambiguous: a UUID
    by its shortest unique prefix of at least 8 digits, a member id (consumer groups) by its
    unique tail, a Faust URL by its host's unique prefix and its port (``_url_labels``); any
    that reads as another's label whole. ``describe --json`` has the full ids."""
    pids = set(pids)
    labels = _unique_prefixes((p for p in pids if _is_uuid(p)), 8)
    labels |= _member_labels(p for p in pids if not _is_uuid(p) and "://" not in p)
    labels |= _url_labels(p for p in pids if "://" in p)
    # Each kind's labels are unique among that kind only: a plan's plain id "3f2a9c1e" and a
    # UUID starting with it read alike. Whole until none does (whole ids differ: it ends).
    while clashing := _clashing_labels(labels):
        labels |= {pid: _whole_id(pid) for pid in clashing}
    return labels


def _whole_id(pid: str) -> str:
    return pid.rstrip("/") if "://" in pid else pid


def _clashing_labels(labels: Mapping[str, str]) -> set[str]:
    """The ids, not yet shown whole, whose label another id's reads alike."""
    shared = Counter(labels.values())
    return {pid for pid, label in labels.items() if shared[label] > 1 and label != _whole_id(pid)}
