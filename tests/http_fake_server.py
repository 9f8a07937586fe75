"""The real app and uvicorn over FakeRunner, for subprocess tests of shutdown and transport
behaviour that do not need a real model. Usage: http_fake_server.py --port P [--delay S]
[any `attnserve serve` flag]."""
from __future__ import annotations

import argparse

import uvicorn
from http_fakes import FakeRunner, tokenizer_json

from attnserve.service.app import create_app
from attnserve.service.settings import add_settings_arguments, settings_from_args

parser = argparse.ArgumentParser()
parser.add_argument("--delay", type=float, default=0.0)
add_settings_arguments(parser)
args = parser.parse_args()
settings = settings_from_args(args)
app = create_app(settings, runner=FakeRunner(max_length=settings.max_length, delay=args.delay), tokenizer_path=tokenizer_json())
uvicorn.run(app, host=settings.host, port=settings.port, log_level="warning", timeout_graceful_shutdown=settings.graceful_shutdown_timeout)
