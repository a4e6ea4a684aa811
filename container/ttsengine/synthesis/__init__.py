"""One request's life, no device loop: request, plan (text chunks, prompts, voice codes), stream, output.

Never imports engine/."""
