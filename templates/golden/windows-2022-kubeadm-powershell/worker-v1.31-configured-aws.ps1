<powershell>
# Rendered by bootplate from ClusterBootstrapTemplate windows-2022-kubeadm-powershell (revision 8aea2b00f7f1625b) for role worker.
$ErrorActionPreference = 'Stop'
$ProgressPreference = 'SilentlyContinue'

# Write-BootplateFile: writes -Text (or the bytes of -Base64, gunzipped with -Gzip) to -Path.
function Write-BootplateFile {
  param([string]$Path, [string]$Text, [string]$Base64, [switch]$Gzip, [switch]$Private)
  $directory = Split-Path -Parent $Path
  if ($directory) {
    New-Item -ItemType Directory -Force -Path $directory | Out-Null
  }
  if ($Private) {
    [IO.File]::WriteAllBytes($Path, [byte[]]@())
    & icacls.exe $Path /inheritance:r /grant:r '*S-1-5-18:F' '*S-1-5-32-544:F' | Out-Null
    if ($LASTEXITCODE -ne 0) {
      throw "bootplate: cannot restrict access to $Path"
    }
  }
  if ($Base64) {
    $bytes = [Convert]::FromBase64String($Base64)
    if ($Gzip) {
      $compressed = New-Object IO.MemoryStream -ArgumentList @(, $bytes)
      $gunzip = New-Object IO.Compression.GZipStream -ArgumentList $compressed, ([IO.Compression.CompressionMode]::Decompress)
      $plain = New-Object IO.MemoryStream
      $gunzip.CopyTo($plain)
      $bytes = $plain.ToArray()
    }
    [IO.File]::WriteAllBytes($Path, $bytes)
  } else {
    [IO.File]::WriteAllText($Path, $Text, (New-Object Text.UTF8Encoding -ArgumentList $false))
  }
}

Write-BootplateFile -Path 'C:\Program Files\containerd\config.toml' -Text @'
# containerd configuration for Kubernetes on Windows (bootplate).
version = 2

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.example.com/pause:3.10"

[plugins."io.containerd.grpc.v1.cri".containerd]
  default_runtime_name = "runhcs-wcow-process"

[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runhcs-wcow-process]
  runtime_type = "io.containerd.runhcs.v1"

[plugins."io.containerd.grpc.v1.cri".cni]
  bin_dir = 'C:\opt\cni\bin'
  conf_dir = 'C:\etc\cni\net.d'

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = 'C:\Program Files\containerd\certs.d'

'@

Write-BootplateFile -Path 'C:\k\kubeadm-join-config.yaml' -Private -Text @'
# kubeadm configuration written by bootplate for a joining Windows worker.
apiVersion: kubeadm.k8s.io/v1beta4
kind: JoinConfiguration
discovery:
  bootstrapToken:
    apiServerEndpoint: "api.demo.example.com:6443"
    token: "abcdef.0123456789abcdef"
    caCertHashes: ["sha256:0000000000000000000000000000000000000000000000000000000000000000"]
nodeRegistration:
  name: "demo-md-0-v1-31"
  criSocket: npipe:////./pipe/containerd-containerd
  imagePullPolicy: IfNotPresent
  ignorePreflightErrors: ["SystemVerification"]
  kubeletExtraArgs:
    - name: "cloud-provider"
      value: "external"
    - name: "node-labels"
      value: "os=windows"
  taints:
    - key: node.cluster.x-k8s.io/uninitialized
      effect: NoSchedule
    - {"effect":"NoSchedule","key":"os","value":"windows"}

'@

& {
# Part network.
$utf8 = New-Object Text.UTF8Encoding -ArgumentList $false
$bundle = Join-Path $env:TEMP ('bootplate-' + 'corp' + '.crt')
[IO.File]::WriteAllText($bundle, @'
-----BEGIN CERTIFICATE-----
MIIBrjCCAVOgAwIBAgIUPsDlyARalflHm0C5777Bd1ugaMowCgYIKoZIzj0EAwIw
KzEpMCcGA1UEAwwgYm9vdHBsYXRlIHNhbXBsZSAobm90IGEgcmVhbCBDQSkwIBcN
MjYxMjAyMDUxNzU1WhgPMjEyNjExMDgwNTE3NTVaMCsxKTAnBgNVBAMMIGJvb3Rw
bGF0ZSBzYW1wbGUgKG5vdCBhIHJlYWwgQ0EpMFkwEwYHKoZIzj0CAQYIKoZIzj0D
AQcDQgAEyPhRhj+6PJsDPakwN0WoZ747Xo/oBThpXX+rr/VZg/0irHUZxKmK+Wxi
IVEMeRsZvoNkwbktOBdFuTc0kr1NuKNTMFEwHQYDVR0OBBYEFJqJ2dkcQ4AAq0OD
ntHFzx9eRITZMB8GA1UdIwQYMBaAFJqJ2dkcQ4AAq0ODntHFzx9eRITZMA8GA1Ud
EwEB/wQFMAMBAf8wCgYIKoZIzj0EAwIDSQAwRgIhAIK3rbMo/z372bQ7L4YNxnNM
AL7H2VFFj7seGzTfhixXAiEAyA6tBdBaQH1iBKSETuKq2m/4bKcfF/QVdN55msbU
w6M=
-----END CERTIFICATE-----

'@, $utf8)
Import-Certificate -FilePath $bundle -CertStoreLocation 'Cert:\LocalMachine\Root' | Out-Null
Remove-Item -Force -Path $bundle
$hosts = Join-Path 'C:\Program Files\containerd\certs.d' 'docker.io'
New-Item -ItemType Directory -Force -Path $hosts | Out-Null
[IO.File]::WriteAllText((Join-Path $hosts 'hosts.toml'), @'
server = "https://registry-1.docker.io"

[host."https://mirror.example.com"]
  capabilities = ["pull", "resolve"]


'@, $utf8)
$proxy = @{ HTTP_PROXY = 'http://proxy.example.com:3128'; HTTPS_PROXY = ''; NO_PROXY = 'localhost,127.0.0.1,::1,192.168.0.0/16,10.96.0.0/12,.svc,.cluster.local,api.demo.example.com,demo-md-0-v1-31,corp.example.com' }
foreach ($name in $proxy.Keys) {
  if ($proxy[$name]) {
    [Environment]::SetEnvironmentVariable($name, $proxy[$name], 'Machine')
    Set-Item -Path ('env:' + $name) -Value $proxy[$name]
  }
}
$servers = @('time.example.com')
foreach ($server in $servers) {
  if ($server -notmatch '^[A-Za-z0-9.:-]+$') {
    throw 'bootplate: network.ntpServers: a server is not a host name or address'
  }
}
& w32tm.exe /config ('/manualpeerlist:' + ($servers -join ' ')) /syncfromflags:manual /update | Out-Null
if ($LASTEXITCODE -ne 0) {
  throw 'bootplate: network.ntpServers: w32tm /config failed'
}
Restart-Service -Name w32time
# network.imageRepository is for the first control-plane machine only: a worker pulls no control-plane image.
}

& {
# Part install: containerd from its GitHub releases, kubelet.exe and kubeadm.exe of the
# Machine's Kubernetes version from dl.k8s.io (or the network input's artifacts), each
# checked against its SHA-256 before it is used.
$kubernetesVersion = 'v1.31.2'
if ($kubernetesVersion -notmatch '^v[0-9]+\.[0-9]+\.[0-9]+$') {
  throw 'bootplate: the Machine has no spec.version like v1.31.2'
}
if (-not (Get-WindowsFeature -Name Containers).Installed) {
  throw 'bootplate: the Windows feature Containers is not installed (it needs a reboot): use an image that has it'
}
[Net.ServicePointManager]::SecurityProtocol = [Net.ServicePointManager]::SecurityProtocol -bor [Net.SecurityProtocolType]::Tls12
# Get-BootplateDownload: downloads Url to Path (five attempts) and checks its SHA-256:
# Sha256, else the digest published beside it (Url + ChecksumSuffix).
function Get-BootplateDownload {
  param([string]$Url, [string]$Sha256, [string]$Path, [string]$ChecksumSuffix)
  if (-not $Sha256) {
    $digestFile = $Path + '.digest'
    Invoke-WebRequest -UseBasicParsing -Uri ($Url + $ChecksumSuffix) -OutFile $digestFile
    $Sha256 = ((Get-Content -Raw -Path $digestFile).Trim() -split '\s+')[0]
    Remove-Item -Force -Path $digestFile
  }
  for ($attempt = 1; $attempt -le 5; $attempt++) {
    try {
      Invoke-WebRequest -UseBasicParsing -Uri $Url -OutFile $Path
      break
    } catch {
      if ($attempt -eq 5) {
        throw ('bootplate: install: cannot download ' + $Url)
      }
      Start-Sleep -Seconds (5 * $attempt)
    }
  }
  if ((Get-FileHash -Algorithm SHA256 -Path $Path).Hash -ne $Sha256) {
    Remove-Item -Force -Path $Path
    throw ('bootplate: install: ' + $Url + ' does not match its SHA-256: not installed')
  }
}
$containerdHome = 'C:\Program Files\containerd'
if (-not (Test-Path -Path (Join-Path $containerdHome 'containerd.exe'))) {
  $version = '1.7.25'
  $url = ''
  if (-not $url) {
    $url = 'https://github.com/containerd/containerd/releases/download/v' + $version + '/containerd-' + $version + '-windows-amd64.tar.gz'
  }
  $archive = Join-Path $env:TEMP 'bootplate-containerd.tar.gz'
  Get-BootplateDownload -Url $url -Sha256 '' -Path $archive -ChecksumSuffix '.sha256sum'
  New-Item -ItemType Directory -Force -Path $containerdHome | Out-Null
  & tar.exe -xzf $archive -C $containerdHome --strip-components 1
  if ($LASTEXITCODE -ne 0) {
    throw 'bootplate: install: cannot unpack containerd'
  }
  Remove-Item -Force -Path $archive
}
if (-not (Get-Service -Name containerd -ErrorAction SilentlyContinue)) {
  & (Join-Path $containerdHome 'containerd.exe') --register-service
  if ($LASTEXITCODE -ne 0) {
    throw 'bootplate: install: containerd --register-service failed'
  }
}
New-Item -ItemType Directory -Force -Path 'C:\k' | Out-Null
$binaries = @(
  @('kubelet', 'https://files.example.com/kubelet.exe', 'abababababababababababababababababababababababababababababababab'),
  @('kubeadm', '', '')
)
foreach ($binary in $binaries) {
  $path = 'C:\k\' + $binary[0] + '.exe'
  if (Test-Path -Path $path) {
    continue
  }
  $url = $binary[1]
  if (-not $url) {
    $url = 'https://dl.k8s.io/release/{0}/bin/windows/amd64/{1}.exe' -f $kubernetesVersion, $binary[0]
  }
  Get-BootplateDownload -Url $url -Sha256 $binary[2] -Path $path -ChecksumSuffix '.sha256'
}
}

& {
# The kubelet as a Windows service (kubelet.exe --windows-service), unless the image
# has one. Its command line carries what kubeadm would put in kubeadm-flags.env (the
# node name, the taints, the extra flags): a Windows service reads no environment file.
if (-not (Get-Service -Name kubelet -ErrorAction SilentlyContinue)) {
  $nodeName = 'demo-md-0-v1-31'
  if ($nodeName -notmatch '^[a-z0-9]([a-z0-9.-]*[a-z0-9])?$') {
    throw 'bootplate: the node name is not a Kubernetes node name'
  }
  $taints = @('node.cluster.x-k8s.io/uninitialized:NoSchedule')
  $taints += ('os' + '=' + 'windows' + ':' + 'NoSchedule').Replace('=:', ':')
  $kubeletArgs = @(
    '--windows-service',
    '--config=C:\var\lib\kubelet\config.yaml',
    '--bootstrap-kubeconfig=C:\etc\kubernetes\bootstrap-kubelet.conf',
    '--kubeconfig=C:\etc\kubernetes\kubelet.conf',
    '--cert-dir=C:\var\lib\kubelet\pki',
    '--container-runtime-endpoint=npipe:////./pipe/containerd-containerd',
    ('--hostname-override=' + $nodeName),
    ('--register-with-taints=' + ($taints -join ',')),
    '--cgroups-per-qos=false',
    '--enforce-node-allocatable=',
    '--resolv-conf='
  )
  $kubeletArgs += ('--' + 'cloud-provider' + '=' + 'external')
  $kubeletArgs += ('--' + 'node-labels' + '=' + 'os=windows')
  foreach ($argument in $kubeletArgs) {
    if ($argument -notmatch '^--[A-Za-z0-9-]+(=[A-Za-z0-9._:/=,@+\\-]*)?$') {
      throw 'bootplate: a kubelet flag (kubeletExtraArgs or nodeTaints) holds characters other than letters, digits and ._:/=,@+-'
    }
  }
  New-Item -ItemType Directory -Force -Path 'C:\var\lib\kubelet', 'C:\etc\kubernetes' | Out-Null
  New-Service -Name kubelet -DisplayName 'kubelet' -StartupType Automatic -BinaryPathName ('"C:\k\kubelet.exe" ' + ($kubeletArgs -join ' ')) | Out-Null
  & sc.exe failure kubelet reset= 0 actions= restart/10000 | Out-Null
  if ($LASTEXITCODE -ne 0) {
    throw 'bootplate: install: sc.exe failure kubelet failed'
  }
}
}

& {
# Part configure: the directories the CNI's HostProcess containers write to, the
# kubelet's port in the firewall, the proxy for containerd and the kubelet (their
# services' environment), then containerd restarted with its configuration.
New-Item -ItemType Directory -Force -Path 'C:\opt\cni\bin', 'C:\etc\cni\net.d', 'C:\var\log\kubelet' | Out-Null
if (-not (Get-NetFirewallRule -Name 'bootplate-kubelet' -ErrorAction SilentlyContinue)) {
  New-NetFirewallRule -Name 'bootplate-kubelet' -DisplayName 'kubelet (bootplate)' -Direction Inbound -Protocol TCP -LocalPort 10250 -Action Allow | Out-Null
}
$environment = @()
foreach ($name in @('HTTP_PROXY', 'HTTPS_PROXY', 'NO_PROXY')) {
  $value = [Environment]::GetEnvironmentVariable($name, 'Machine')
  if ($value) {
    $environment += ($name + '=' + $value)
  }
}
foreach ($service in @('containerd', 'kubelet')) {
  $key = 'HKLM:\SYSTEM\CurrentControlSet\Services\' + $service
  if (Test-Path -Path $key) {
    Set-ItemProperty -Path $key -Name Environment -Type MultiString -Value $environment
  }
}
Restart-Service -Name containerd
Set-Service -Name kubelet -StartupType Automatic
}

& {
# Part kubeadm-join.
if (Test-Path -Path 'C:\etc\kubernetes\kubelet.conf') {
  Write-Output 'bootplate: this machine already joined the cluster'
} else {
  & 'C:\k\kubeadm.exe' join --config 'C:\k\kubeadm-join-config.yaml'
  if ($LASTEXITCODE -ne 0) {
    throw ('bootplate: kubeadm join failed with exit code ' + $LASTEXITCODE)
  }
}
}

New-Item -ItemType Directory -Force -Path 'C:\run\cluster-api' | Out-Null
Set-Content -Path 'C:\run\cluster-api\bootstrap-success.complete' -Value 'success'
</powershell>
