"""A user's DCGAN training script, instrumented from docs/client.md ("Several models").

Written the way pytorch/examples' ``dcgan/main.py`` is (``weights_init``, ``netG``/``netD``,
``BCELoss`` with ``real_label``/``fake_label``, the discriminator's two passes then the
generator's, ``--niter``-style options), shrunk to 16x16 single-channel images of noise
blobs so it runs on a CPU in seconds. The monitoring is the lines marked ``# monitor``.

``--unnamed`` watches both models without names, as a user who has not read that section
would: the client refuses the second watch() loudly, and the script says so and exits 3.
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.optim as optim

import monitor_client  # monitor

parser = argparse.ArgumentParser()
parser.add_argument("--batchSize", type=int, default=16)
parser.add_argument("--nz", type=int, default=8)
parser.add_argument("--ngf", type=int, default=8)
parser.add_argument("--ndf", type=int, default=8)
parser.add_argument("--niter", type=int, default=40)
parser.add_argument("--lr", type=float, default=0.0002)
parser.add_argument("--beta1", type=float, default=0.5)
parser.add_argument("--run_id", default=None)
parser.add_argument("--unnamed", action="store_true")
opt = parser.parse_args()

torch.manual_seed(999)
device = torch.device("cpu")
nz, ngf, ndf, nc = opt.nz, opt.ngf, opt.ndf, 1


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 2, 4, 1, 0, bias=False),
            nn.BatchNorm2d(ngf * 2),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, ngf, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ngf),
            nn.ReLU(True),
            nn.ConvTranspose2d(ngf, nc, 4, 2, 1, bias=False),
            nn.Tanh(),
        )

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False),
            nn.BatchNorm2d(ndf * 2),
            nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False),
            nn.Sigmoid(),
        )

    def forward(self, input):
        return self.main(input).view(-1, 1).squeeze(1)


netG = Generator().to(device)
netG.apply(weights_init)
netD = Discriminator().to(device)
netD.apply(weights_init)

criterion = nn.BCELoss()
fixed_noise = torch.randn(opt.batchSize, nz, 1, 1, device=device)
real_label, fake_label = 1.0, 0.0
optimizerD = optim.Adam(netD.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=opt.lr, betas=(opt.beta1, 0.999))

mon = monitor_client.Monitor(project="dcgan", run_id=opt.run_id, loss_kind="gan",  # monitor
                             config=vars(opt), total_steps=opt.niter)  # monitor
try:  # monitor
    mon.watch(netD, optimizerD, name=None if opt.unnamed else "D")  # monitor
    mon.watch(netG, optimizerG, name=None if opt.unnamed else "G")  # monitor
except ValueError as exc:  # monitor
    print(f"refused: {exc}", file=sys.stderr)  # monitor
    mon.close()  # monitor
    sys.exit(3)  # monitor


def real_batch():
    """Blobs of light on a dark 16x16 field: the 'dataset'."""
    x = torch.linspace(-1, 1, 16)
    centre = torch.rand(opt.batchSize, 2, 1, 1) - 0.5
    d2 = (x.view(1, 1, 1, 16) - centre[:, :1]) ** 2 + (x.view(1, 1, 16, 1) - centre[:, 1:]) ** 2
    return (torch.exp(-d2 * 8) * 2 - 1).to(device)


for i in range(1, opt.niter + 1):
    # (1) Update D network: maximize log(D(x)) + log(1 - D(G(z)))
    netD.zero_grad()
    real_cpu = real_batch()
    batch_size = real_cpu.size(0)
    label = torch.full((batch_size,), real_label, device=device)
    output = netD(real_cpu)
    errD_real = criterion(output, label)
    errD_real.backward()
    D_x = output.mean().item()
    noise = torch.randn(batch_size, nz, 1, 1, device=device)
    fake = netG(noise)
    label.fill_(fake_label)
    output = netD(fake.detach())
    errD_fake = criterion(output, label)
    errD_fake.backward()
    D_G_z1 = output.mean().item()
    errD = errD_real + errD_fake
    optimizerD.step()
    # (2) Update G network: maximize log(D(G(z)))
    netG.zero_grad()
    label.fill_(real_label)
    output = netD(fake)
    errG = criterion(output, label)
    errG.backward()
    D_G_z2 = output.mean().item()
    optimizerG.step()
    mon.log_step(i, loss=errG, samples=batch_size, loss_D=errD.item(), D_x=D_x)  # monitor
    if i % 10 == 0:
        print(f"[{i}/{opt.niter}] Loss_D: {errD.item():.4f} Loss_G: {errG.item():.4f} "
              f"D(x): {D_x:.4f} D(G(z)): {D_G_z1:.4f} / {D_G_z2:.4f}")

mon.close()  # monitor
