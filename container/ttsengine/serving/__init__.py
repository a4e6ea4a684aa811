"""What the adapters share: the wire protocol, delivery of a stream as bytes, stored voices, model download,
and the service (one boot: the engine(s), voices, logging, the error table, the body limit)."""
