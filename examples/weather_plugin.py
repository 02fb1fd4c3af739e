"""A Toolport plugin in plain Python (standard library only).

Starts a callback server on 127.0.0.1 (any free port), registers one tool with Toolport, answers
calls with the {output, is_error} envelope, and clears its tools on exit.

    python3 examples/weather_plugin.py --toolport http://127.0.0.1:3917
"""
import argparse
import json
import signal
import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SOURCE = "plugin:weather"
FORECASTS = {"shanghai": 28, "oslo": -3}


def toolport(base, path, body):
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.load(response)


class Callback(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: Toolport reuses its connection

    def do_POST(self):
        call = json.loads(self.rfile.read(int(self.headers["content-length"])))
        location = str(call["arguments"].get("location", ""))
        if location.lower() in FORECASTS:
            reply = {"output": {"location": location, "temperature_c": FORECASTS[location.lower()]}, "is_error": False}
        else:
            reply = {"error": f"no forecast for {location}", "is_error": True}
        body = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):  # call payloads are private: do not log them
        pass


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--toolport", default="http://127.0.0.1:3917")
    args = parser.parse_args()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Callback)
    port = server.server_address[1]
    threading.Thread(target=server.serve_forever, daemon=True).start()

    result = toolport(args.toolport, "/api/tools/register", {
        "name": "get_weather",
        "description": "Get weather for a location.",
        "parameters": {
            "type": "object",
            "properties": {"location": {"type": "string"}},
            "required": ["location"],
        },
        "callback_url": f"http://127.0.0.1:{port}/tools/get_weather",
        "source": SOURCE,
        "timeout_seconds": 10,
    })
    print(f"registered get_weather for {result['affected_roles']}", flush=True)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    stop.wait()
    toolport(args.toolport, "/api/tools/clear", {"source": SOURCE})
    server.shutdown()


if __name__ == "__main__":
    main()
