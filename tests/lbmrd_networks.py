"""lbmrd configuration files of many networks and transformation rules, for
lbmrd's hostile-configuration and stall tests."""

from __future__ import annotations


def networks_file(n: int, per_domain: int = 1000, overlap_every: int = 0) -> str:
    """An lbmrd file of ``n`` /32 networks, ``per_domain`` to a domain (and a /24 at every
    ``overlap_every``-th, overlapping), and n / 10 transformation rules, one in ten
    shadowed by the one before."""
    out = ['<?xml version="1.0"?>', '<lbmrd version="1.0">', "<domains>"]
    for d in range(max(1, n // per_domain)):
        out.append(f'<domain name="d{d}">')
        for k in range(per_domain):
            i = d * per_domain + k
            out.append(f"<network>10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}/32</network>")
            if overlap_every and i % overlap_every == 0:
                out.append(f"<network>10.{(i >> 16) & 255}.{(i >> 8) & 255}.0/24</network>")
        out.append("</domain>")
    out += ["</domains>", "<transformations>"]
    for k in range(n // 10):  # one rule in ten shadowed by the one before
        port = "*" if k % 10 == 0 else str(1000 + k)
        out.append(f'<transform source="d0" destination="d{k % max(1, n // per_domain)}"><rule>'
                   f'<match address="10.9.{(k >> 8) & 255}.{k & 255}" port="{port}"/>'
                   '<replace address="10.8.0.1" port="*"/></rule></transform>')
    out += ["</transformations>", "</lbmrd>"]
    return "\n".join(out)
