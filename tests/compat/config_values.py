"""monarch.config as a Monarch program sees it (issue #26): how a duration reads back, which
values are refused and how, and default_transport as a BindSpec.  Runs unchanged on torchmonarch
0.7.0 (tests/compat/test_api_compat.py compares the two)."""

import pickle

from monarch._rust_bindings.monarch_hyperactor.channel import BindSpec, ChannelTransport
from monarch.config import configured, get_global_config


def refused(**kwargs):
    """What a configured(...) raises (a TypeError or a ValueError), and whether it names a bad duration."""
    try:
        with configured(**kwargs):
            pass
    except TypeError as e:
        return f"TypeError {'Invalid duration format' in str(e)}"
    except ValueError as e:
        return f"ValueError {'Invalid duration format' in str(e)}"
    return "accepted"


# A duration reads back in its largest units, whatever form it was given in.
for given in ("45s", "90s", "1h30m", "1h 30m", "3661s", "1500ms", "120m", "2 weeks", "40d", "0s", "7200s"):
    with configured(message_delivery_timeout=given) as cfg:
        print(f"duration {given!r} -> {cfg['message_delivery_timeout']!r}")

for given in ("30", "soon", "abc123", "", "-5s", 30, 2.5, None):
    print(f"refused {given!r}: {refused(stop_actor_timeout=given)}")

cfg = get_global_config()
for key in ("message_delivery_timeout", "message_ack_time_interval", "get_proc_state_max_idle",
            "supervision_watchdog_timeout", "split_max_buffer_age", "cleanup_timeout"):
    print(f"default {key} {cfg[key]!r}")

# default_transport: whatever names a transport reads back as the BindSpec of it.
print("default transport is unix:", cfg["default_transport"] == BindSpec(ChannelTransport.Unix))
for given, same_as in (("TcpWithLocalhost", BindSpec(ChannelTransport.TcpWithLocalhost)),
                       ("tcp", BindSpec(ChannelTransport.TcpWithHostname)),
                       ("unix", BindSpec(ChannelTransport.Unix)),
                       ("tcp://127.0.0.1:8080", BindSpec("tcp://127.0.0.1:8080"))):
    with configured(default_transport=getattr(ChannelTransport, given) if given[0].isupper() else given) as cfg:
        print(f"transport {given!r}: {cfg['default_transport'] == same_as}",
              cfg["default_transport"] == BindSpec(ChannelTransport.Unix), str(cfg["default_transport"]))
print("transports print as:", [(repr(t), str(BindSpec(t))) for t in (
    ChannelTransport.TcpWithLocalhost, ChannelTransport.MetaTlsWithIpV6, ChannelTransport.Quic, ChannelTransport.Unix)])
print("tcp address differs from another:", BindSpec("tcp://127.0.0.1:8080") == BindSpec("tcp://127.0.0.1:8081"))
for given in ("random_string", "invalid://scheme", 42, {}):
    print(f"transport refused {given!r}: {refused(default_transport=given)}")
print("after: unix again", get_global_config()["default_transport"] == BindSpec(ChannelTransport.Unix))
print("transports pickle:", all(pickle.loads(pickle.dumps(t)) == t for t in (
    ChannelTransport.Unix, ChannelTransport.TcpWithHostname, ChannelTransport.Tls, ChannelTransport.Local)))
print("done")
