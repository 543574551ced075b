import ctypes,os,subprocess,sys,json
if len(sys.argv)>1:
    c=ctypes.CDLL("libcuda.so.1");r=c.cuInit(0);n=ctypes.c_int(0)
    if r: print(json.dumps({"init":r}));sys.exit()
    c.cuDeviceGetCount(ctypes.byref(n));out=[]
    for i in range(n.value):
        d=ctypes.c_int();c.cuDeviceGet(ctypes.byref(d),i);u=(ctypes.c_ubyte*16)();c.cuDeviceGetUuid(u,d);out.append(bytes(u).hex())
    print(json.dumps({"count":n.value,"uuids":out}));sys.exit()
u=subprocess.run(["nvidia-smi","--query-gpu=uuid,mig.mode.current","--format=csv,noheader"],capture_output=True,text=True).stdout.strip()
print("smi:",u);g=u.split(",")[0].strip()
vals=[g,g.lower(),"gpu-"+g[4:],"GPU-"+g[4:].upper(),g[:12].lower(),"MIG-"+g[4:],"mig-"+g[4:],"MIG-"+g[4:]+",0","0,MIG-"+g[4:],"MIG-"+g+"/1/0",g+",0","MIG-zz,0"]
for v in vals:
    e=dict(os.environ,CUDA_VISIBLE_DEVICES=v)
    p=subprocess.run([sys.executable,__file__,"x"],env=e,capture_output=True,text=True)
    print(repr(v),"->",p.stdout.strip(),p.stderr.strip()[-200:])
