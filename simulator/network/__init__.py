"""Communication over the fabric: collective kinds and algorithms (ring, double binary
tree, in-switch reduction) priced on the bottleneck link a group's traffic crosses
(``collectives``)."""
