"""``slobench gate``: CI rules over two summaries, their evaluation, and the text / JUnit / markdown
outputs."""
