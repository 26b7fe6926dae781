"""lbmr_proto: the LBMR (Ultra Messaging topic resolution) wire format."""
