"""Wire-independent tensor codecs: datatype table, BYTES framing, JSON data."""
