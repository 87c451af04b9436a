import sys; sys.path.insert(0,"/tmp/rev-h")
from hc import *
pid=int(sys.argv[1]); p=sock_path(pid)
try:
    s=conn(p); s.sendall(b'{"op":"hello","version":1}\n{"op":"purge"}\n'); print(readline(s)); print(readline(s))
except Exception as e: print("exc", e)
