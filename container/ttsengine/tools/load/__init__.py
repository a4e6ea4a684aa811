"""The pieces of `python -m ttsengine loadtest`: arrival schedules, the client, playback stalls, the server's
/metrics breakdown and the level's summary."""
