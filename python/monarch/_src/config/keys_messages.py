"""The config keys of the section "Messages and channels" of docs/config.md: frame sizes,
delivery and acknowledgement, TCP settings of channel connections, buffers sent out of
band.

The registry (:mod:`monarch._src.config.keys`) lists them in this order.
"""

from __future__ import annotations

from monarch._src.config.keys_base import POSITIVE, USIZE, Key, in_group
from monarch._src.config.kinds import (
    BOOL,
    DURATION,
    ENCODING,
    FRACTION,
    MS,
    STRING,
    Encoding,
    S,
    integer,
)

#: The docs section these keys are listed in.
GROUP = "Messages and channels"

#: The keys of the section, in docs order.
KEYS: list[Key] = [
    *in_group(
        GROUP,
        Key(
            "codec_max_frame_length",
            "HYPERACTOR_CODEC_MAX_FRAME_LENGTH",
            USIZE,
            10 * 1024**3,
            "The largest serialized message, in bytes.",
            effect="The largest frame (message) a process sends or accepts; read when a process "
            "starts its runtime, and passed to the procs it spawns. Processes that talk "
            "to each other need the same value.",
        ),
        Key(
            "message_delivery_timeout",
            "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT",
            DURATION,
            30 * S,
            "A message not delivered within this time is returned as undeliverable.",
            effect="A message its destination's proc has not acknowledged within this time, "
            "while nothing moved on the link (the peer is frozen or cut off, or the "
            "connection never completed), fails its link: it and every other message not "
            "yet acknowledged there are returned undeliverable, with an error naming the "
            "address and this key (a proc its host cannot reach so is killed and reported "
            "lost). A slow transfer that keeps moving is not cut. Read when a process "
            "starts its runtime.",
        ),
        Key(
            "message_ack_time_interval",
            "HYPERACTOR_MESSAGE_ACK_TIME_INTERVAL",
            DURATION,
            500 * MS,
            "How often a channel's receiver acknowledges messages.",
            ignored="A channel's receiver here acknowledges frames as soon as they are delivered "
            "(cumulative acknowledgements), so there is no interval to tune.",
        ),
        Key(
            "message_ack_every_n_messages",
            "HYPERACTOR_MESSAGE_ACK_EVERY_N_MESSAGES",
            USIZE,
            1000,
            "A channel's receiver acknowledges at least every this many messages.",
            ignored="A channel's receiver here acknowledges frames as soon as they are delivered "
            "(cumulative acknowledgements), so there is no count to tune.",
        ),
        Key(
            "message_ttl_default",
            "HYPERACTOR_MESSAGE_TTL_DEFAULT",
            integer(0, 255),
            64,
            "The default number of hops a message envelope may take.",
            ignored="Messages here go straight to the destination proc (casts down a tree of "
            "bounded depth), so envelopes carry no hop count.",
        ),
        Key(
            "message_latency_sampling_rate",
            "HYPERACTOR_MESSAGE_LATENCY_SAMPLING_RATE",
            FRACTION,
            0.01,
            "The fraction of messages whose latency is logged.",
            ignored="Every handled message is counted here, its latency in a per-endpoint "
            "histogram the dashboard shows; nothing is sampled.",
        ),
        Key(
            "default_encoding",
            "HYPERACTOR_DEFAULT_ENCODING",
            ENCODING,
            Encoding.Multipart,
            "How message payloads are serialized: Encoding.Bincode, Encoding.Json or "
            "Encoding.Multipart.",
            ignored="Python payloads here are always pickles (protocol 5, large buffers out of "
            "band) and the runtime's own messages have one fixed encoding.",
        ),
        Key(
            "split_max_buffer_size",
            "HYPERACTOR_SPLIT_MAX_BUFFER_SIZE",
            USIZE,
            5,
            "How many updates a split port buffers before reducing them.",
            ignored="Replies to a cast here are reduced by the nodes of its tree as they arrive; "
            "there are no split ports that buffer updates.",
        ),
        Key(
            "split_max_buffer_age",
            "HYPERACTOR_SPLIT_MAX_BUFFER_AGE",
            DURATION,
            50 * MS,
            "The longest an update stays buffered in a split port before it is reduced.",
            ignored="Replies to a cast here are reduced by the nodes of its tree as they arrive; "
            "there are no split ports that buffer updates.",
        ),
        Key(
            "channel_net_rx_buffer_full_check_interval",
            "HYPERACTOR_CHANNEL_NET_RX_BUFFER_FULL_CHECK_INTERVAL",
            DURATION,
            5 * S,
            "How often a network receiver checks whether its buffer is full.",
            ignored="A receiver here that stops taking frames stops reading its socket, which "
            "holds the sender to its byte budget; nothing polls for a full buffer.",
        ),
        Key(
            "channel_tcp_keepalive_idle",
            "HYPERACTOR_CHANNEL_TCP_KEEPALIVE_IDLE",
            DURATION,
            60 * S,
            "Idle time before the kernel's first TCP keepalive probe on a channel.",
            effect="How long a TCP connection of a channel may be idle before the kernel sends "
            "its first keepalive probe (then one every 5 s, 3 in all: a dead peer is "
            "found within this time + 15 s even when nothing is sent). Read when a "
            "process starts its runtime; applies to connections made after.",
        ),
        Key(
            "channel_tcp_congestion",
            "HYPERACTOR_CHANNEL_TCP_CONGESTION",
            STRING,
            "",
            "The TCP congestion control algorithm of channel connections, such as 'bbr' "
            "(empty: the system's default).",
            effect="The congestion control of every TCP connection of a channel this process "
            "makes or accepts ('bbr', 'cubic', 'reno'...; empty: the kernel's default). A "
            "name the kernel refuses leaves its default and logs one warning. Read when a "
            "process starts its runtime; applies to connections made after.",
        ),
        Key(
            "channel_reconnect_timeout",
            "HYPERACTOR_CHANNEL_RECONNECT_TIMEOUT",
            DURATION,
            60 * S,
            "How long a channel link retries a failed connection before it closes.",
            ignored="Links here never reconnect: a link whose connection fails is dead at once "
            "and its unacknowledged messages are returned undeliverable.",
        ),
        Key(
            "enable_dest_actor_reordering_buffer",
            "HYPERACTOR_ENABLE_DEST_ACTOR_REORDERING_BUFFER",
            BOOL,
            False,
            "Reorder messages per destination actor on receipt.",
            ignored="Messages from one sender to one actor are always delivered in order here "
            "(one ordered link per pair of procs, sequenced casts), so no reordering buffer "
            "exists.",
        ),
        Key(
            "sequencer_max_locked_keys",
            "HYPERACTOR_SEQUENCER_MAX_LOCKED_KEYS",
            POSITIVE,
            128,
            "How many destinations the message sequencer assigns under one lock.",
            ignored="The cast sequencer here numbers messages per sender and target actor, with "
            "no lock over destinations to bound.",
        ),
        Key(
            "terminated_snapshot_retention",
            "HYPERACTOR_TERMINATED_SNAPSHOT_RETENTION",
            USIZE,
            100,
            "How many snapshots of terminated actors a proc keeps for introspection.",
            ignored="The admin server here (the dashboard) records the end of each actor in its "
            "event log instead of keeping snapshots of terminated actors.",
        ),
        Key(
            "server_heartbeat_interval",
            "HYPERACTOR_SERVER_HEARTBEAT_INTERVAL",
            DURATION,
            S,
            "How often a channel server emits its liveness metric.",
            ignored="Channel servers here emit no liveness metric; hosts' liveness is checked "
            "with host heartbeats (host_heartbeat_interval).",
        ),
        Key(
            "forwarder_flush_timeout",
            "HYPERACTOR_FORWARDER_FLUSH_TIMEOUT",
            DURATION,
            5 * S,
            "How long a proc's forwarder waits for acknowledgements when it shuts down.",
            ignored="Procs here have no forwarder: each sends straight to the destination proc, "
            "and unacknowledged messages are bounded by message_delivery_timeout.",
        ),
        Key(
            "small_write_threshold",
            "MONARCH_HYPERACTOR_SMALL_WRITE_THRESHOLD",
            USIZE,
            64 << 10,
            "Pickled buffers smaller than this many bytes are copied; larger ones are "
            "sent without a copy.",
            effect="Buffers of at least this many bytes in a message (NumPy arrays, CPU "
            "tensors, top-level bytes arguments and return values) travel out of band, as "
            "message parts of their own, instead of being copied into the pickle (64 KiB "
            "by default here; 256 in upstream Monarch). Read at each message.",
        ),
    ),
]
