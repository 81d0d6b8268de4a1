"""The router's own HTTP/1.1 server (one protocol object per connection, no aiohttp server).

heads.py       answer heads: status lines, header lines, Date, each formatted once
answers.py     the whole answer (`Whole`): status, header lines, body; how to make one;
               the bound on engines' answers held at once (`HeldAnswers`, `Hold`)
connection.py  one connection: its state, caps, timers and closing; the request
               and stream objects a handler sees; what a listening socket shares
server.py      parsing (httptools) and answering in turn: FastProtocol, FastServer
routes.py      the route table (`FastRoutes`) and the small routes: health, metrics, admin
"""
