# A busy infinite loop.
while True:
  pass
