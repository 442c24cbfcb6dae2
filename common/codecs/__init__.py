"""Wire-independent tensor codecs shared by server and client: datatype table, BYTES framing, raw and values."""
