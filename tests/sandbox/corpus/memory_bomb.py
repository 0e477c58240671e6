# Memory bomb: grow a list of 64 MiB blocks, touching every page, until something gives.
blocks = []
while True:
  blocks.append(bytearray(64 << 20))
