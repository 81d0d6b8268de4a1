"""The APIs passed through beside chat and completions.

catalog.py       each API's route and what the router reads of it
passthrough.py   the one handler of them all
anthropic.py     Anthropic Messages' key header, error shape and stream error
anthropicmodels.py  Anthropic's Models API: its model object and its list's pages
conversation.py  Responses and Messages conversations in chat's shape, for routing
forms.py         the few fields read of a multipart upload (audio)
usage.py         token counts from the Responses and Anthropic usage objects
"""
