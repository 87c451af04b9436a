import os, time, threading, torch
from transformers import BertConfig, BertModel
threading.Thread(target=time.sleep, args=(600,), daemon=True).start()
torch.manual_seed(0)
models = [BertModel(BertConfig()) for _ in range(2)]
open(os.environ["READY"], "w").write("1")
time.sleep(600)
