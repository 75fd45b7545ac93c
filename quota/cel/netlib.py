"""The Kubernetes IP and CIDR CEL libraries (base.go enables them from 1.30).

Follows k/k staging/src/k8s.io/apiserver/pkg/cel/library/ip.go and cidr.go: `ip()`,
`isIP()`, `ip.isCanonical()`, family and the address-class predicates with Go's
net/netip meanings (Go's "global unicast" includes private ranges, unlike Python's
`is_global`), `cidr()`, `isCIDR()`, `containsIP`, `containsCIDR`, `ip()`, `masked()`,
`prefixLength()`, and `string()` of both. Zones and IPv4-mapped IPv6 addresses are
refused as there. Registered into `quota.cel.library.REGISTRY` on import.
"""

from __future__ import annotations

import ipaddress
from typing import Union

from quota.cel.library import register
from quota.cel.types import register_runtime_type
from quota.cel.values import EvalError

Address = Union[ipaddress.IPv4Address, ipaddress.IPv6Address]
Interface = Union[ipaddress.IPv4Interface, ipaddress.IPv6Interface]


class IP:
    __slots__ = ("addr",)
    cel_type_name = "net.IP"

    def __init__(self, addr: Address) -> None:
        self.addr = addr

    def __eq__(self, other: object) -> bool:
        return isinstance(other, IP) and self.addr == other.addr

    def __hash__(self) -> int:
        return hash(self.addr)


class CIDR:
    __slots__ = ("iface",)
    cel_type_name = "net.CIDR"

    def __init__(self, iface: Interface) -> None:
        self.iface = iface

    def __eq__(self, other: object) -> bool:
        return isinstance(other, CIDR) and (self.iface.ip, self.iface.network.prefixlen) == (
            other.iface.ip, other.iface.network.prefixlen)

    def __hash__(self) -> int:
        return hash((self.iface.ip, self.iface.network.prefixlen))


register_runtime_type("net.IP", IP)
register_runtime_type("net.CIDR", CIDR)


def _check(text: str, address: Address) -> None:
    if isinstance(address, ipaddress.IPv6Address):
        if address.scope_id:
            raise EvalError(f'IP address "{text}" with zone value is not allowed')
        if address.ipv4_mapped is not None:
            raise EvalError(f'IPv4-mapped IPv6 address "{text}" is not allowed')


def parse_ip(text: str) -> IP:
    try:
        address = ipaddress.ip_address(text)
    except ValueError as exc:
        raise EvalError(f'IP Address "{text}" parse error during conversion from string: {exc}') from None
    _check(text, address)
    return IP(address)


def parse_cidr(text: str) -> CIDR:
    if "%" in text:
        # Go's netip.ParsePrefix (library/cidr.go) refuses zones; Python's
        # ip_interface would keep the address and drop the zone silently.
        raise EvalError(
            f"network address parse error during conversion from string: netip.ParsePrefix({text!r}): "
            "IPv6 zones cannot be present in a prefix"
        )
    if "/" not in text:
        raise EvalError(f'network address parse error during conversion from string: no "/" in "{text}"')
    try:
        iface = ipaddress.ip_interface(text)
    except ValueError as exc:
        raise EvalError(f"network address parse error during conversion from string: {exc}") from None
    _check(text, iface.ip)
    return CIDR(iface)


@register("ip", "string -> net.IP")
def _ip(text: str) -> IP:
    return parse_ip(text)


@register("isIP", "string -> bool")
def _is_ip(text: str) -> bool:
    try:
        parse_ip(text)
    except EvalError:
        return False
    return True


@register("ip.isCanonical", "string -> bool")
def _is_canonical(text: str) -> bool:
    return str(parse_ip(text).addr) == text


@register("string", "net.IP -> string")
def _ip_string(ip: IP) -> str:
    return str(ip.addr)


@register("family", "net.IP -> int", member=True)
def _family(ip: IP) -> int:
    return ip.addr.version


@register("isUnspecified", "net.IP -> bool", member=True)
def _is_unspecified(ip: IP) -> bool:
    return ip.addr.is_unspecified


@register("isLoopback", "net.IP -> bool", member=True)
def _is_loopback(ip: IP) -> bool:
    return ip.addr.is_loopback


@register("isLinkLocalMulticast", "net.IP -> bool", member=True)
def _is_link_local_multicast(ip: IP) -> bool:
    if ip.addr.version == 4:
        return ip.addr in ipaddress.ip_network("224.0.0.0/24")
    return ip.addr in ipaddress.ip_network("ff02::/16")


@register("isLinkLocalUnicast", "net.IP -> bool", member=True)
def _is_link_local_unicast(ip: IP) -> bool:
    return ip.addr.is_link_local


@register("isGlobalUnicast", "net.IP -> bool", member=True)
def _is_global_unicast(ip: IP) -> bool:
    # Go netip.Addr.IsGlobalUnicast: everything but unspecified, loopback, multicast,
    # link-local unicast and the IPv4 broadcast address (private ranges included).
    addr = ip.addr
    if addr.version == 4 and addr == ipaddress.IPv4Address("255.255.255.255"):
        return False
    return not (addr.is_unspecified or addr.is_loopback or addr.is_multicast or addr.is_link_local)


@register("cidr", "string -> net.CIDR")
def _cidr(text: str) -> CIDR:
    return parse_cidr(text)


@register("isCIDR", "string -> bool")
def _is_cidr(text: str) -> bool:
    try:
        parse_cidr(text)
    except EvalError:
        return False
    return True


@register("string", "net.CIDR -> string")
def _cidr_string(cidr: CIDR) -> str:
    return f"{cidr.iface.ip}/{cidr.iface.network.prefixlen}"


@register("containsIP", "net.CIDR, net.IP -> bool", member=True)
@register("containsIP", "net.CIDR, string -> bool", member=True)
def _contains_ip(cidr: CIDR, ip: IP | str) -> bool:
    address = ip.addr if isinstance(ip, IP) else parse_ip(ip).addr
    return address.version == cidr.iface.version and address in cidr.iface.network


@register("containsCIDR", "net.CIDR, net.CIDR -> bool", member=True)
@register("containsCIDR", "net.CIDR, string -> bool", member=True)
def _contains_cidr(cidr: CIDR, other: CIDR | str) -> bool:
    inner = other if isinstance(other, CIDR) else parse_cidr(other)
    return (
        inner.iface.version == cidr.iface.version
        and inner.iface.network.prefixlen >= cidr.iface.network.prefixlen
        and inner.iface.ip in cidr.iface.network
    )


@register("ip", "net.CIDR -> net.IP", member=True)
def _cidr_ip(cidr: CIDR) -> IP:
    return IP(cidr.iface.ip)


@register("masked", "net.CIDR -> net.CIDR", member=True)
def _masked(cidr: CIDR) -> CIDR:
    network = cidr.iface.network
    return CIDR(ipaddress.ip_interface(f"{network.network_address}/{network.prefixlen}"))


@register("prefixLength", "net.CIDR -> int", member=True)
def _prefix_length(cidr: CIDR) -> int:
    return cidr.iface.network.prefixlen
